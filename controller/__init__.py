"""The controller's logic: the matrix (validation, defaults, expansion into configs), the plan checks and
progress display behind the bench role's action plugins, and the GPU passthrough filters. Runs where
`ansible-playbook` runs; the Ansible plugins under `plugins/` only call into it.
"""
