"""Filters for NVIDIA GPU passthrough into LXC containers (Proxmox VE `devN` entries or raw `lxc.*` lines).

Pure functions over the text of real host files and commands: `/proc/devices`, `ls -l /dev/nvidia*`,
`/proc/driver/nvidia/version`, `nvidia-smi --query-gpu ... --format=csv`, `nvidia-smi -q -x`, `pveversion`,
`pct config <ctid>` and LXC config files (nvidia-smi and the driver version are read by `agent.gpu`, the one
parser of them). The module imports nothing from Ansible; `plugins/filter/nvidia.py` makes these filters.

Device nodes are named relative to the device folder (`nvidia0`, `nvidiactl`, `nvidia-uvm`, ...): on the host
they live under `dev_dir` (`/dev` on a real host), inside the container under `dev/`.

One module past 400 lines on purpose: the filters are small functions over the same few parsed files, and the
filter plugin exposes them as one list (`FILTERS`).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from agent import gpu

NVIDIA_MAJOR = 195             # fixed: nvidia0..N (minor N), nvidia-modeset (254), nvidiactl (255)
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
UVM = "nvidia-uvm"             # dynamic major: nvidia-uvm (minor 0), nvidia-uvm-tools (minor 1)
DEFAULT_MOUNT_OPTIONS = "bind,optional,create=file"
ALLOW_KEYS = {1: "lxc.cgroup.devices.allow", 2: "lxc.cgroup2.devices.allow"}
STYLES = ("pve", "lxc")        # `key: value` (/etc/pve/lxc/<ctid>.conf) or `key = value` (/var/lib/lxc/<name>/config)
# Nodes this module manages; a config line for one of them that is no longer wanted is stale.
MANAGED_NODE = re.compile(r"^(nvidia\d+|nvidiactl|nvidia-modeset|nvidia-uvm|nvidia-uvm-tools)$")

_LS_RE = re.compile(r"^([cb])[rwxsStT-]{9}[.+@]?\s+\d+\s+(\S+)\s+(\S+)\s+(\d+),\s*(\d+)\s+.*\s(\S+)$")
_DEV_KEY = re.compile(r"^dev(\d+)$")
_VERSION_RE = re.compile(r"\d+(?:\.\d+)+")

Text = Union[str, bytes]


def _text(value: Text) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------------------------------------------
# /proc/devices and device nodes
# ---------------------------------------------------------------------------------------------------------------

def proc_devices(text: Text) -> dict[str, int]:
    """`/proc/devices` as {name: major}, character devices only (a name listed twice keeps its first major)."""
    devices: dict[str, int] = {}
    section = None
    for raw in _text(text).splitlines():
        line = raw.strip()
        if line.endswith("devices:"):
            section = line.split()[0].lower()
            continue
        parts = line.split(None, 1)
        if section == "character" and len(parts) == 2 and parts[0].isdigit():
            devices.setdefault(parts[1], int(parts[0]))
    return devices


def _devices(devices: Union[Text, Mapping[str, int]]) -> dict[str, int]:
    return dict(devices) if isinstance(devices, Mapping) else proc_devices(devices)


def nvidia_majors(devices: Union[Text, Mapping[str, int]]) -> dict[str, int]:
    """The NVIDIA character majors by name (`nvidia`, `nvidia-uvm`, `nvidia-caps`, ...) from `/proc/devices`.

    Raises ValueError when the driver's two essential majors are missing (module not loaded) or `nvidia`
    is not the fixed 195.
    """
    majors = {name: major for name, major in _devices(devices).items() if name.startswith("nvidia")}
    missing = [name for name in ("nvidia", UVM) if name not in majors]
    if missing:
        raise ValueError(f"/proc/devices has no {' or '.join(missing)}: is the NVIDIA driver "
                         f"({'nvidia_uvm' if missing == [UVM] else 'nvidia'}) loaded?")
    if majors["nvidia"] != NVIDIA_MAJOR:
        raise ValueError(f"nvidia has major {majors['nvidia']} in /proc/devices, expected {NVIDIA_MAJOR}")
    return majors


def nvidia_dev_listing(text: Text) -> list[dict[str, Any]]:
    """Device nodes from `ls -l`/`ls -la` output (`crw-rw-rw- 1 root root 195,   0 Nov 30 06:28 /dev/nvidia0`).

    Handles the `<dir>:` sections `ls` prints for directories; each node once, in listing order:
    {path, type ('c'/'b'), major, minor, owner, group}.
    """
    nodes: dict[str, dict[str, Any]] = {}
    folder = ""
    for raw in _text(text).splitlines():
        line = raw.rstrip()
        if line.endswith(":") and " " not in line:
            folder = line[:-1]
            continue
        match = _LS_RE.match(line)
        if not match:
            continue
        kind, owner, group, major, minor, name = match.groups()
        path = name if name.startswith("/") or not folder else f"{folder.rstrip('/')}/{name}"
        nodes.setdefault(path, {"path": path, "type": kind, "major": int(major), "minor": int(minor),
                                "owner": owner, "group": group})
    return list(nodes.values())


def nvidia_node_names(gpu_count: int, uvm_tools: bool = True, modeset: bool = False,
                      extra: Sequence[str] = ()) -> list[str]:
    """The node names a container with `gpu_count` GPUs needs, relative to the device folder."""
    count = int(gpu_count)
    if count < 1:
        raise ValueError(f"gpu_count must be at least 1, got {gpu_count!r}")
    names = [f"nvidia{i}" for i in range(count)] + ["nvidiactl"]
    names += ["nvidia-modeset"] if modeset else []
    names += [UVM] + (["nvidia-uvm-tools"] if uvm_tools else [])
    names += [n.strip("/") for n in extra if n.strip("/") not in names]
    return names


def nvidia_expected_nodes(names: Sequence[str], devices: Union[Text, Mapping[str, int]],
                          dev_dir: str = "/dev") -> list[dict[str, Any]]:
    """{path, name, major, minor} each named node must have; majors of the standard nodes come from
    `/proc/devices` (nvidia-uvm's is dynamic); nodes this module does not know have major/minor None."""
    majors = nvidia_majors(devices)
    known: dict[str, tuple[int, int]] = {"nvidiactl": (NVIDIA_MAJOR, NVIDIACTL_MINOR),
                                         "nvidia-modeset": (NVIDIA_MAJOR, NVIDIA_MODESET_MINOR),
                                         UVM: (majors[UVM], 0), "nvidia-uvm-tools": (majors[UVM], 1)}
    out = []
    for name in names:
        gpu = re.fullmatch(r"nvidia(\d+)", name)
        major, minor = (NVIDIA_MAJOR, int(gpu.group(1))) if gpu else known.get(name, (None, None))
        out.append({"name": name, "path": _join(dev_dir, name), "major": major, "minor": minor})
    return out


def nvidia_node_problems(expected: Sequence[Mapping[str, Any]], listing: Union[Text, Sequence[Mapping[str, Any]]]
                         ) -> list[str]:
    """What is wrong with the nodes on the host: missing, not a character device, or a wrong major/minor."""
    found = {n["path"]: n for n in (nvidia_dev_listing(listing) if isinstance(listing, (str, bytes)) else listing)}
    problems = []
    for want in expected:
        have = found.get(want["path"])
        if have is None:
            problems.append(f"{want['path']} is missing")
        elif have["type"] != "c":
            problems.append(f"{want['path']} is not a character device")
        elif want["major"] is not None and (have["major"], have["minor"]) != (want["major"], want["minor"]):
            problems.append(f"{want['path']} is {have['major']}:{have['minor']}, "
                            f"expected {want['major']}:{want['minor']}")
    return problems


def nvidia_host_problems(devices: Union[Text, Mapping[str, int]], names: Sequence[str],
                         listing: Union[Text, Sequence[Mapping[str, Any]]], dev_dir: str = "/dev") -> list[str]:
    """Everything that keeps the host from passing the named nodes through, [] when nothing: a driver module
    not loaded (majors missing from `/proc/devices`), nodes missing or with other majors than registered."""
    try:
        expected = nvidia_expected_nodes(names, devices, dev_dir)
    except ValueError as exc:
        return [str(exc)]
    return nvidia_node_problems(expected, listing)


def _join(dev_dir: str, name: str) -> str:
    return f"{dev_dir.rstrip('/')}/{name.strip('/')}"


# ---------------------------------------------------------------------------------------------------------------
# Proxmox VE devN entries
# ---------------------------------------------------------------------------------------------------------------

def pve_dev_value(path: str, options: Optional[Mapping[str, Any]] = None) -> str:
    """A `devN` value as `pct` prints it: the path, then the options sorted by key (`/dev/nvidia0,mode=0666`)."""
    opts = {k: v for k, v in (options or {}).items() if v is not None and v != ""}
    unknown = set(opts) - {"mode", "uid", "gid", "deny-write"}
    if unknown:
        raise ValueError(f"unknown devN option(s) {sorted(unknown)}: use mode, uid, gid, deny-write")
    if "mode" in opts and not re.fullmatch(r"0[0-7]{3}", str(opts["mode"])):
        raise ValueError(f"devN mode must be an octal access mode like 0666, got {opts['mode']!r}")
    if "deny-write" in opts:
        deny = str(opts.pop("deny-write")).lower() in ("1", "true", "yes")
        opts.update({"deny-write": 1} if deny else {})
    return ",".join([path] + [f"{k}={opts[k]}" for k in sorted(opts)])


def pve_parse_dev(value: str) -> dict[str, str]:
    """A `devN` property string (`[[path=]<Path>] [,deny-write=<1|0>] [,gid=..] [,mode=..] [,uid=..]`) as a dict."""
    out: dict[str, str] = {}
    for part in value.strip().split(","):
        if not part:
            continue
        key, sep, val = part.partition("=")
        if sep and key in ("path", "deny-write", "gid", "mode", "uid"):
            out[key] = val
        else:
            out["path"] = part
    if out.get("deny-write") == "0":
        del out["deny-write"]
    return out


def pve_dev_args(names: Sequence[str], dev_dir: str = "/dev", options: Optional[Mapping[str, Any]] = None,
                 start: int = 0) -> list[str]:
    """`pct set` arguments giving every node a `devN` entry: `--dev0 /dev/nvidia0,mode=0666 --dev1 ...`."""
    args: list[str] = []
    for i, name in enumerate(names, start=int(start)):
        args += [f"--dev{i}", pve_dev_value(_join(dev_dir, name), options)]
    return args


def pve_config(text: Text) -> dict[str, Any]:
    """`pct config <ctid>` output or the main section of `/etc/pve/lxc/<ctid>.conf`.

    {"options": {key: value}, "lxc": [[key, value], ...], "description": str}: `#` lines are the description,
    `lxc.*` keys are raw LXC lines in order, parsing stops at the first `[section]` (snapshots, pending).
    """
    options: dict[str, str] = {}
    lxc: list[list[str]] = []
    description = []
    for raw in _text(text).splitlines():
        line = raw.strip()
        if line.startswith("["):
            break
        if line.startswith("#"):
            description.append(line[1:])
            continue
        match = re.match(r"^([A-Za-z][\w.\-]*)\s*(:|=)\s*(.*)$", line)
        if not match:
            continue
        key, _, value = match.groups()
        if key.startswith("lxc."):
            lxc.append([key, value.strip()])
        else:
            options[key] = value.strip()
    return {"options": options, "lxc": lxc, "description": "\n".join(description)}


def pve_dev_entries(config: Union[Text, Mapping[str, Any]]) -> dict[int, dict[str, str]]:
    """The `devN` entries of a container config as {N: parsed value}."""
    conf = config if isinstance(config, Mapping) else pve_config(config)
    out = {}
    for key, value in conf["options"].items():
        match = _DEV_KEY.match(key)
        if match:
            out[int(match.group(1))] = pve_parse_dev(value)
    return dict(sorted(out.items()))


def pve_dev_changes(config: Union[Text, Mapping[str, Any]], names: Sequence[str], dev_dir: str = "/dev",
                    options: Optional[Mapping[str, Any]] = None, prune: bool = True) -> list[str]:
    """The `pct set <ctid>` arguments that bring a config's `devN` entries to the wanted nodes; [] when none.

    A node already passed through keeps its index (and is rewritten only when its options differ); a new node
    takes the lowest free index; with `prune`, entries for NVIDIA nodes no longer wanted are deleted
    (`--delete devK`). Entries for other devices are left alone.
    """
    current = pve_dev_entries(config)
    by_path = {entry.get("path"): index for index, entry in current.items()}
    wanted_paths = [_join(dev_dir, n) for n in names]
    args: list[str] = []
    used = set(current)
    free = (i for i in range(0, 256) if i not in used)
    for path in wanted_paths:
        value = pve_dev_value(path, options)
        if path in by_path:
            index = by_path[path]
            if current[index] != pve_parse_dev(value):
                args += [f"--dev{index}", value]
        else:
            index = next(free)
            used.add(index)
            args += [f"--dev{index}", value]
    if prune:
        stale = [f"dev{i}" for i, e in current.items()
                 if e.get("path") not in wanted_paths and _is_managed_path(e.get("path", ""), dev_dir)]
        if stale:
            args += ["--delete", ",".join(stale)]
    return args


def _is_managed_path(path: str, dev_dir: str) -> bool:
    prefix = dev_dir.rstrip("/") + "/"
    return path.startswith(prefix) and bool(MANAGED_NODE.match(path[len(prefix):]))


# ---------------------------------------------------------------------------------------------------------------
# Raw LXC lines (Proxmox VE before 8.1, plain LXC)
# ---------------------------------------------------------------------------------------------------------------

def _cgroup_version(version: Union[int, str]) -> int:
    value = str(version).lower().lstrip("v")
    if value not in ("1", "2"):
        raise ValueError(f"cgroup_version must be 1 or 2, got {version!r}")
    return int(value)


def _style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    return style


def _line(key: str, value: str, style: str) -> str:
    return f"{key}: {value}" if _style(style) == "pve" else f"{key} = {value}"


def lxc_allow_majors(names: Sequence[str], devices: Union[Text, Mapping[str, int]],
                     listing: Union[Text, Sequence[Mapping[str, Any]], None] = None, dev_dir: str = "/dev"
                     ) -> list[int]:
    """The character majors the container must be allowed: 195, nvidia-uvm's (from `/proc/devices`) and those
    of any other named node (from its `ls -l` listing)."""
    majors = {NVIDIA_MAJOR, nvidia_majors(devices)[UVM]}
    unknown = [e["path"] for e in nvidia_expected_nodes(names, devices, dev_dir) if e["major"] is None]
    if unknown:
        found = {n["path"]: n for n in (nvidia_dev_listing(listing) if isinstance(listing, (str, bytes))
                                        else (listing or []))}
        for path in unknown:
            if path not in found:
                raise ValueError(f"no major known for {path}: pass its `ls -l` listing")
            majors.add(found[path]["major"])
    return sorted(majors)


def lxc_raw_lines(names: Sequence[str], majors: Iterable[int], dev_dir: str = "/dev",
                  cgroup_version: Union[int, str] = 2, style: str = "pve",
                  mount_options: str = DEFAULT_MOUNT_OPTIONS) -> list[str]:
    """The raw LXC lines: one device-cgroup allow line per major (`lxc.cgroup2.devices.allow: c 195:* rwm`,
    `lxc.cgroup.devices.allow` for cgroup v1) and one bind mount per node
    (`lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file`)."""
    key = ALLOW_KEYS[_cgroup_version(cgroup_version)]
    lines = [_line(key, f"c {m}:* rwm", style) for m in sorted(set(int(m) for m in majors))]
    lines += [_line("lxc.mount.entry", f"{_join(dev_dir, n)} dev/{n.strip('/')} none {mount_options}", style)
              for n in names]
    return lines


def lxc_line_regexp(line: str) -> str:
    """A regexp matching a raw line written with either separator and any spacing (for `lineinfile`)."""
    match = re.match(r"^\s*(lxc\.[\w.]+)\s*[:=]\s*(.*?)\s*$", line)
    if not match:
        raise ValueError(f"not a raw lxc line: {line!r}")
    key, value = match.groups()
    words = [re.escape(w) for w in value.split()]
    return "^\\s*" + re.escape(key) + "\\s*[:=]\\s*" + "\\s+".join(words) + "\\s*$"


def lxc_line_items(lines: Sequence[str]) -> list[dict[str, str]]:
    """[{line, regexp}] for a `lineinfile` loop."""
    return [{"line": line, "regexp": lxc_line_regexp(line)} for line in lines]


_SECTION = re.compile(r"^[ \t]*\[", re.MULTILINE)


def _main_section(config: Text) -> tuple[str, str]:
    """(the main section, the rest from the first `[section]` line on: snapshots, pending changes)."""
    text = _text(config)
    section = _SECTION.search(text)
    return (text[:section.start()], text[section.start():]) if section else (text, "")


def lxc_stale_lines(config: Text, wanted: Sequence[str], written: Sequence[str] = ()) -> list[str]:
    """Lines of a container config that this role wrote once (`written`, its record on the host) and no longer
    wants, exactly as they are in the file (main section only, before any `[section]`): the nvidia-uvm allow
    line whose dynamic major moved, mounts of GPUs no longer passed through, raw lines that devN entries
    replaced. A line the role did not write stays byte for byte, whatever device it names."""
    written_res = [re.compile(lxc_line_regexp(w)) for w in written]
    wanted_res = [re.compile(lxc_line_regexp(w)) for w in wanted]
    stale = []
    for raw in _main_section(config)[0].splitlines():
        if any(r.match(raw) for r in written_res) and not any(r.match(raw) for r in wanted_res):
            stale.append(raw)
    return stale


def lxc_written_before(written: Sequence[str], missing: Sequence[str]) -> list[str]:
    """The role's record while it changes the config: every line it wrote and every line it is about to add,
    in order (so that a run stopped half way leaves no line of the role's unrecorded)."""
    return [*written, *(m for m in missing if m not in written)]


def lxc_written_after(written: Sequence[str], wanted: Sequence[str], missing: Sequence[str]) -> list[str]:
    """The role's record after a run: the lines it wrote that are still wanted, and the ones it adds now."""
    return [w for w in wanted if w in written or w in missing]


def lxc_config_update(config: Text, stale: Sequence[str], missing: Sequence[str]) -> str:
    """The config with the `stale` lines taken out of its main section and the `missing` ones added after the
    main section's last line; every other byte, later `[sections]` (snapshots, pending) included, as it was."""
    main, rest = _main_section(config)
    lines = main.splitlines(keepends=True)
    for line in stale:
        at = next((i for i, raw in enumerate(lines) if raw.rstrip("\r\n") == line), None)
        if at is not None:
            del lines[at]
    if missing:
        last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
        if last >= 0 and not lines[last].endswith("\n"):
            lines[last] += "\n"
        lines[last + 1:last + 1] = [f"{m}\n" for m in missing]
    return "".join(lines) + rest


def lxc_config_changes(config: Text, names: Sequence[str], devices: Union[Text, Mapping[str, int]],
                       dev_dir: str = "/dev", cgroup_version: Union[int, str] = 2, style: str = "pve",
                       listing: Union[Text, Sequence[Mapping[str, Any]], None] = None,
                       mount_options: str = DEFAULT_MOUNT_OPTIONS, written: Sequence[str] = ()) -> dict[str, Any]:
    """Everything the raw-lines path needs for one config: {wanted: [{line, regexp}], stale: [line],
    missing: [line] (wanted lines not in the config yet), majors: [int], written: [line] (the record after)}."""
    majors = lxc_allow_majors(names, devices, listing, dev_dir)
    wanted = lxc_raw_lines(names, majors, dev_dir, cgroup_version, style, mount_options)
    missing = lxc_missing_lines(config, wanted)
    return {"wanted": lxc_line_items(wanted), "stale": lxc_stale_lines(config, wanted, written),
            "missing": missing, "majors": majors, "written": lxc_written_after(written, wanted, missing)}


def lxc_missing_lines(config: Text, wanted: Sequence[str]) -> list[str]:
    """The wanted lines the config's main section does not hold yet (in any spacing or separator)."""
    present = _main_section(config)[0].splitlines()
    return [w for w in wanted if not any(re.match(lxc_line_regexp(w), p) for p in present)]


def lxc_adopted_lines(config: Text, wanted: Sequence[str]) -> list[str]:
    """Where no record exists yet (a config set up before the role kept one): the wanted lines present exactly
    as the role writes them, taken as the role's, so that the uvm allow line is replaced once its major moves.
    Anything else stays the user's."""
    present = set(_main_section(config)[0].splitlines())
    return [w for w in wanted if w in present]


# ---------------------------------------------------------------------------------------------------------------
# Driver, GPUs, Proxmox VE version
# ---------------------------------------------------------------------------------------------------------------

def nvidia_driver_version(text: Text) -> str:
    """The driver version from /proc/driver/nvidia/version or nvidia-smi output (agent.gpu.driver_version)."""
    return gpu.driver_version(_text(text))


def nvidia_gpu_count(text: Text) -> int:
    """GPUs in nvidia-smi output (agent.gpu.gpu_count)."""
    return gpu.gpu_count(_text(text))


def pve_version(text: Text) -> str:
    """The pve-manager version from `pveversion` (`pve-manager/8.2.4/faa83925c9641325 (running kernel: ...)`)."""
    match = re.search(r"pve-manager/(\d+(?:\.\d+)*)", _text(text))
    if not match:
        raise ValueError(f"not pveversion output: {_text(text)[:80]!r}")
    return match.group(1)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(version)))


def pve_uses_devn(pveversion: Text, minimum: str = "8.1") -> bool:
    """True when the host's Proxmox VE (pveversion output or a bare version) has `devN` passthrough (>= 8.1)."""
    value = _text(pveversion)
    version = pve_version(value) if "pve-manager/" in value else value.strip()
    return _version_tuple(version) >= _version_tuple(minimum)


# ---------------------------------------------------------------------------------------------------------------
# Inside the container: the engine unit's DeviceAllow= lines
# ---------------------------------------------------------------------------------------------------------------

_DEVICE_GROUP = re.compile(r"^(char|block)-\S+$")


def device_allow(entries: Sequence[str], found: Sequence[Mapping[str, Any]] = ()) -> dict[str, list[str]]:
    """The DeviceAllow= lines of a systemd unit from entries `PATH [ACCESS]` or `char-NAME [ACCESS]`.

    systemd takes a device path (stat'ed at every start of the unit; a missing one is skipped with "Couldn't stat
    device") or a `char-`/`block-` group of /proc/devices, but no glob: `DeviceAllow=/dev/nvidia[0-9]*` allows
    nothing. So each path entry, glob or not, becomes one line per character or block node it matched on the host
    (`found`: one `find` result per path entry, `{item: entry, files: [{path, ischr, isblk}, ...]}`), with the
    entry's access; groups are kept as written. Returns {lines, unmatched (path entries that matched no node),
    problems (entries systemd would not take)}.
    """
    by_entry = {r.get("item"): r.get("files") or [] for r in found}
    lines: list[str] = []
    unmatched: list[str] = []
    problems: list[str] = []
    for entry in entries:
        parts = str(entry).split()
        target, access = (parts[0], parts[1:]) if parts else ("", [])
        if len(access) > 1 or (access and not re.fullmatch(r"[rwm]+", access[0])):
            problems.append(f"{entry!r}: the access is one word of r, w and m (e.g. 'rw')")
            continue
        if _DEVICE_GROUP.match(target):  # systemd matches the name against /proc/devices itself (fnmatch)
            lines.append(" ".join(parts))
            continue
        if not target.startswith("/dev/"):
            problems.append(f"{entry!r}: want a path under /dev/ (globs allowed) or char-NAME / block-NAME")
            continue
        nodes = sorted(f["path"] for f in by_entry.get(entry, []) if f.get("ischr") or f.get("isblk"))
        if not nodes:
            unmatched.append(str(entry))
        lines += [" ".join([node, *access]) for node in nodes]
    return {"lines": list(dict.fromkeys(lines)), "unmatched": unmatched, "problems": problems}


# The functions the bench roles use as filters (plugins/filter/nvidia.py).
FILTERS = (
    "device_allow",
    "proc_devices",
    "nvidia_majors",
    "nvidia_dev_listing",
    "nvidia_node_names",
    "nvidia_expected_nodes",
    "nvidia_node_problems",
    "nvidia_host_problems",
    "pve_dev_value",
    "pve_parse_dev",
    "pve_dev_args",
    "pve_config",
    "pve_dev_entries",
    "pve_dev_changes",
    "lxc_allow_majors",
    "lxc_raw_lines",
    "lxc_line_regexp",
    "lxc_line_items",
    "lxc_stale_lines",
    "lxc_written_before",
    "lxc_written_after",
    "lxc_missing_lines",
    "lxc_adopted_lines",
    "lxc_config_update",
    "lxc_config_changes",
    "nvidia_driver_version",
    "nvidia_gpu_count",
    "pve_version",
    "pve_uses_devn",
)
