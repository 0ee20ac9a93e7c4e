"""Download one revision of a Hugging Face repository into a folder (specfleet, role model_weights).

Argument: one JSON object {repo_id, revision, repo_type, local_dir, allow_patterns, ignore_patterns,
max_workers, log, token_on_stdin}. huggingface_hub resumes: finished files are kept, partial ones continue.
With token_on_stdin the token is read from stdin and handed to huggingface_hub as HF_TOKEN in this process's
environment: never in the arguments, and never in the environment Ansible builds the remote command with
(`environment:` values appear in the EXEC line that -vvv prints, even under no_log). The revision is resolved
on the Hub first, so an unreachable Hub is a failure, never a silently returned partial folder. On failure the
traceback goes to `log` with the token's value replaced by ***, and the exit status is 1.
"""
import json
import os
import sys
import traceback


def main() -> int:
    spec = json.loads(sys.argv[1])
    if spec.get("token_on_stdin"):
        os.environ["HF_TOKEN"] = sys.stdin.read().strip()
    token = os.environ.get("HF_TOKEN", "")
    repo_type = spec.get("repo_type") or "model"
    try:
        from huggingface_hub import HfApi, snapshot_download

        # Resolve the revision on the Hub first: snapshot_download falls back to returning an existing,
        # possibly partial local_dir with only a warning when the Hub cannot be reached.
        commit = HfApi().repo_info(spec["repo_id"], revision=spec["revision"], repo_type=repo_type).sha
        path = snapshot_download(
            repo_id=spec["repo_id"],
            revision=commit,
            repo_type=repo_type,
            local_dir=spec["local_dir"],
            allow_patterns=spec.get("allow_patterns") or None,
            ignore_patterns=spec.get("ignore_patterns") or None,
            max_workers=int(spec.get("max_workers") or 8),
        )
        partial = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(spec["local_dir"], ".cache"))
                   for f in files if f.endswith(".incomplete")]
        if partial:
            raise RuntimeError(f"download left partial files: {partial[:5]}")
    except BaseException:  # noqa: BLE001 - every failure is reported through the log
        text = traceback.format_exc()
        if token:
            text = text.replace(token, "***")
        with open(spec["log"], "w") as f:
            f.write(text)
        print(text.strip().splitlines()[-1], file=sys.stderr)
        return 1
    print(json.dumps({"path": str(path), "commit": commit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
