"""README.md and its docs/ pages stay true: every command in them is run as typed by a named test, every page is
linked and every link leads somewhere, and their lists match the code."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from agent.classify import Reason
from tests.readme import ROOT, commands, pages, text

# Each command of the README and its pages -> the tests that run it exactly as typed (tests/readme.py `typed`).
COVERED: dict[str, list[str]] = {
    "make demo": ["tests/playbooks/test_readme_local.py::demo"],
    "make test": [".ci/run"],  # CI's whole run; it cannot run inside itself
    "make test-fast": ["tests/playbooks/test_readme_local.py::test_make_test_fast_runs_the_tests_not_marked_slow"],
    ". .venv/bin/activate": ["tests/readme.py::typed"],  # sourced before every command after it
    "ansible-playbook bench.yml -l local --check": ["tests/playbooks/test_readme_local.py::"
                                                    "test_check_mode_starts_nothing"],
    "ansible-playbook bench.yml -l local -e run_id=<id>": [
        "tests/playbooks/test_readme_local.py::test_resume_keeps_every_config_then_force_measures_one_again"],
    "ansible-playbook bench.yml -l local -e run_id=<id> -e force=true -e configs=ngram-k2": [
        "tests/playbooks/test_readme_local.py::test_resume_keeps_every_config_then_force_measures_one_again"],
    "specfleet report results/<id> --format md|csv|json": [
        "tests/playbooks/test_readme_local.py::test_collector_report_in_each_format"],
    "specfleet compare results/<old-id> results/<id>": [
        "tests/playbooks/test_readme_local.py::test_resume_keeps_every_config_then_force_measures_one_again"],
    # llama.cpp: built (unchanged: `make test` built it first), then its embedded suite into the demo's run
    **dict.fromkeys(("make llamacpp gguf-models", "ansible-playbook bench.yml -l local-llamacpp -e run_id=<id>"), [
        "tests/playbooks/test_readme_local.py::test_llamacpp_into_the_demos_run_sets_the_engines_side_by_side_and_"
        "lands_on_its_synthetic_acceptance"]),
    "ansible-playbook bench.yml -l ct200 -e plan=true": [
        "tests/playbooks/test_readme_local.py::test_plan_for_ct200_prints_every_config_without_connecting"],
    "ansible-playbook bench.yml -l ct200 -e plan=true -e phases=tp1": [
        "tests/playbooks/test_readme_local.py::test_plan_for_ct200_one_phase"],
    "ansible-playbook bench.yml -l ct200 -e plan=true -e configs=dflash-nooverlap,ddtree-b16 -e sweeps=context": [
        "tests/playbooks/test_readme_local.py::test_plan_for_ct200_selected_configs_and_sweeps"],
    "ansible-playbook bench.yml -l ct200 --check": [
        "tests/playbooks/test_readme_local.py::test_check_on_unreachable_ct200_says_what_it_could_not_check"],
    **{cmd: ["tests/playbooks/test_readme_local.py::"
             "test_suite_on_unreachable_ct200_starts_nothing_and_says_how_to_resume"]
       for cmd in ("ansible-playbook bench.yml -l ct200", "ansible-playbook bench.yml -l ct200 -e run_id=<id>",
                   "ansible-playbook bench.yml -l ct200 -e run_id=<id> -e force=true",
                   "ansible-playbook bench.yml -l ct200 -e skip_unsupported=true")},
    # as typed, ct200 is out of reach; the playbooks run for real on test hosts in test_provision_hosts.py
    "ansible-playbook playbooks/provision.yml -l ct200": [
        "tests/playbooks/test_readme_local.py::test_provisioning_unreachable_ct200_stops_at_once",
        "tests/playbooks/test_provision_hosts.py::test_provision_twice_every_role_changes_then_nothing"],
    "ansible-playbook playbooks/recover.yml -l ct200": [
        "tests/playbooks/test_readme_local.py::test_provisioning_unreachable_ct200_stops_at_once",
        "tests/playbooks/test_provision_hosts.py::test_recover_after_a_reboot_of_the_proxmox_host"],
    # several hosts: the README's test-hosts block
    "make testhosts": ["tests/playbooks/conftest.py::testhosts"],
    "ansible-playbook playbooks/engine.yml -l testhosts": ["tests/playbooks/conftest.py::testhosts"],
    "ansible-playbook bench.yml -l testhosts": ["tests/playbooks/test_testhosts_suite.py::two_host_run"],
    "specfleet pull -l testhosts [<id>]": [
        "tests/playbooks/test_testhosts_suite.py::test_collector_pull_fetches_a_run"],
    # the history store: `specfleet db`, `specfleet history ...` and each `specfleet db --sql "..."` example
    **{cmd: ["tests/playbooks/test_readme_local.py::"
             "test_history_of_the_demo_its_forced_rerun_and_a_run_with_a_changed_engine_flag"]
       for cmd in commands() if cmd.split(" --", 1)[0] in ("specfleet db", "specfleet history")},
    "ansible-playbook bench.yml -l ct200 -e plan=true -e bench_pack=true": [
        "tests/playbooks/test_readme_local.py::test_plan_for_ct200_packed"],
    "ansible-playbook playbooks/provision.yml -l ct200 --list-tags": [
        "tests/roles/test_playbook_tags.py::test_list_tags_as_typed_lists_every_phase_of_provisioning"],
    "ansible-playbook playbooks/provision.yml -l ct200 --tags sglang_patches": [
        "tests/roles/test_playbook_tags.py::test_one_phase_as_typed_on_unreachable_ct200_stops_at_once"],
    # llama.cpp on the test hosts from the wheelhouse (docs/several-hosts.md)
    "ansible-playbook playbooks/llamacpp.yml -l testhosts --check": [
        "tests/playbooks/test_testhosts_suite.py::test_llamacpp_from_the_wheelhouse_in_check_mode"],
}


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_readme_command_is_run_as_typed_by_a_test() -> None:
    assert commands() == list(COVERED), "README commands and their tests differ: update COVERED or the README"


def test_the_named_tests_exist() -> None:
    for command, where in COVERED.items():
        for ref in where:
            path, _, name = ref.partition("::")
            source = (ROOT / path).read_text()
            if not name:
                assert f"\n{command}\n" in f"\n{source}\n", (command, ref)
                continue
            assert name in _functions(ROOT / path), ref


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in commands()
    assert re.search(r"^make test$", (ROOT / ".ci/run").read_text(), re.M)


def test_readme_lists_every_failure_reason() -> None:
    paragraph = text()[text().index("Failure reasons"):].split("Each status", 1)[0]
    assert re.findall(r"`([a-z_]+)`", paragraph) == [r.value for r in Reason]


def test_every_page_is_linked_and_every_link_leads_somewhere() -> None:
    """Each docs/ page is linked from the README; each relative link of the pages names a file that exists and, with
    an anchor, a heading of that file (as GitHub makes anchors: lower case, punctuation dropped, spaces as -)."""
    assert set(pages()[1:]) == set((ROOT / "docs").glob("*.md"))
    for page in pages():
        for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), (page.name, target)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, (page.name, target, anchor)
