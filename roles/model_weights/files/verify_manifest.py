"""Check the files of a folder against a manifest (specfleet, role model_weights).

Arguments: the folder and a JSON list of {path, size, sha256} (size and sha256 each optional). Prints
{"checked": n, "problems": [...]} as JSON; exit status 1 when a file is missing or differs.
"""
import hashlib
import json
import os
import sys


def check(folder: str, manifest: list) -> list:
    problems = []
    for entry in manifest:
        path = os.path.join(folder, entry["path"])
        if not os.path.isfile(path):
            problems.append(f"{entry['path']}: missing")
            continue
        size = os.path.getsize(path)
        if entry.get("size") is not None and size != int(entry["size"]):
            problems.append(f"{entry['path']}: size {size}, expected {entry['size']}")
            continue
        if entry.get("sha256"):
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    digest.update(block)
            if digest.hexdigest() != str(entry["sha256"]).lower():
                problems.append(f"{entry['path']}: sha256 {digest.hexdigest()}, expected {entry['sha256']}")
    return problems


def main() -> int:
    manifest = json.loads(sys.argv[2])
    problems = check(sys.argv[1], manifest)
    print(json.dumps({"checked": len(manifest), "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
