"""Cluster profiles: what Snakemake's profile mechanism leaves to the workflow -- site settings and a checker.

Snakemake itself finds the profiles, from a fresh clone with no set-up step: ``snakemake --profile slurm all``
from the repository root (Snakemake looks a ``--profile`` name up in the working directory first, where the links
``slurm`` and ``gaudi`` lead to ``profiles/``; docs/cluster.md says why), or ``snakemake --workflow-profile
profiles/slurm`` (``--workflow-profile slurm`` is looked up under ``profiles/`` next to the Snakefile) from anywhere.
Snakemake rejects unknown options itself. What a profile cannot hold is the site: a workflow profile
overrides a user's own ``--profile`` key by key (``default-resources``, ``set-resources`` as a whole), so
partitions and accounts cannot be layered in from there.

Rules declare portable resources only (``rules/resources.smk``: threads, mem_mb, runtime, gpu, hpu).
The profiles ``profiles/slurm`` and ``profiles/gaudi`` map them onto a Slurm site. The site's own
values -- partitions, account, QoS, constraints, GPU type, GRES name, how many jobs at once -- are not
written in the profiles; they come from, in increasing priority:

1. the defaults in :data:`SITE_KEYS`;
2. an override file, ``$CF_CLUSTER_SITE_FILE`` or ``$XDG_CONFIG_HOME/counterfactory/cluster.yaml``
   (``~/.config/...``): top-level keys for every profile, a mapping under ``slurm:`` / ``gaudi:`` for
   one profile;
3. ``CF_SLURM_*`` environment variables.

The profiles call :func:`profile_site` when Snakemake loads them (YTE ``__definitions__``); it also
checks the values against the running cluster (``sinfo``, ``scontrol``), so an unknown partition, a
GPU partition without the GRES, or a status command that cannot work stops ``snakemake --profile slurm``
before anything is submitted, with one line per problem naming the fix (:func:`profile_site`).
:func:`check_profile` (``counterfactory cluster check-profile``) checks a whole profile for what Snakemake
accepts silently: resource, rule and group names that do not exist in this workflow, GRES strings and options
the Slurm plugin refuses only at submission, and the same cluster checks; key typos it names with the closest
valid option.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .errors import ConfigError

REPO_PROFILES = ("slurm", "gaudi")
PROFILE_DIR = Path(__file__).resolve().parents[2] / "profiles"  # source checkout (editable install)

# Rules that run on an accelerator (rules/resources.smk: `gpu=GPU, hpu=HPU`); the profiles send them to
# the GPU partition. tests/test_profiles.py checks this list against the rule files.
ACCELERATOR_RULES = ("captions_edit", "images_generate", "evaluate_itr", "evaluate_itm", "evaluate_classify",
                     "train_run", "train_run_pretrained", "train_run_in_domain", "social_generate",
                     "social_filter_clip", "social_filter_nsfw", "social_filter_detect", "social_probe", "social_debias_run",
                     "social_image_quality_features", "countercurate_positions_rewrite",
                     "countercurate_attributes", "countercurate_generate", "countercurate_evaluate",
                     "countercurate_train_run", "countercurate_vlm_run", "spurious_inpaint", "spurious_captioner",
                     "spurious_run", "cvld_intervene", "cvld_edit", "cvld_run", "score_item",
                     "verify_vqa")


class ClusterConfigError(ConfigError):
    """A profile or the site settings do not fit the cluster."""


@dataclass(frozen=True)
class SiteKey:
    env: str
    kind: type
    default: Any
    help: str


SITE_KEYS: dict[str, SiteKey] = {
    "partition": SiteKey("CF_SLURM_PARTITION", str, None,
                         "partition of CPU jobs (unset: the cluster's default partition)"),
    "gpu_partition": SiteKey("CF_SLURM_GPU_PARTITION", str, None,
                             "partition of GPU / Gaudi jobs (unset: same as partition)"),
    "account": SiteKey("CF_SLURM_ACCOUNT", str, None,
                       "account to charge (unset: the plugin guesses it from sacct, else none)"),
    "qos": SiteKey("CF_SLURM_QOS", str, None, "QoS of every job"),
    "constraint": SiteKey("CF_SLURM_CONSTRAINT", str, None, "node features of CPU jobs (sbatch -C)"),
    "gpu_constraint": SiteKey("CF_SLURM_GPU_CONSTRAINT", str, None,
                              "node features of GPU / Gaudi jobs (unset: same as constraint)"),
    "gpu_model": SiteKey("CF_SLURM_GPU_MODEL", str, None,
                         "slurm profile: GPU type, sbatch --gpus=TYPE:N (e.g. a100); needs device auto/cuda"),
    "gres_name": SiteKey("CF_SLURM_GRES", str, "gpu",
                         "gaudi profile: GRES name of the Gaudi cards (Intel's Slurm fork: gpu)"),
    "jobs": SiteKey("CF_SLURM_JOBS", int, 100, "jobs queued or running at once"),
    "max_threads": SiteKey("CF_SLURM_MAX_THREADS", int, 8,
                           "most CPUs one submitted job asks for (Snakemake's --cores: caps threads, and how many "
                           "grouped jobs run side by side)"),
    "status_command": SiteKey("CF_SLURM_STATUS_COMMAND", str, "squeue",
                              "squeue (works without slurmdbd; needs MinJobAge >= 3 x status_delay) or sacct"),
    "status_delay": SiteKey("CF_SLURM_STATUS_DELAY", int, 40, "seconds before the first job status check"),
}
SKIP_CHECK_ENV = "CF_SLURM_SKIP_CHECK"
SITE_FILE_ENV = "CF_CLUSTER_SITE_FILE"

# resource names a profile may set: Snakemake's own, ours (rules/resources.smk), the Slurm plugin's
KNOWN_RESOURCES = frozenset({
    "mem_mb", "mem_mib", "mem", "disk_mb", "disk_mib", "disk", "runtime", "tmpdir", "threads", "gpu", "hpu",
    "slurm_partition", "slurm_account", "slurm_cluster", "cluster", "clusters", "constraint", "qos",
    "cpus_per_task", "cpus_per_gpu", "tasks", "tasks_per_gpu", "tasks_per_node", "nodes", "mpi",
    "mem_mb_per_cpu", "gres", "gpu_model", "slurm_extra",
})
# the plugin's format for GRES (utils.set_gres_string): name, name:count, name:type:count
GRES_RE = re.compile(r"^[a-zA-Z0-9_]+(:[a-zA-Z0-9_.]+)?(:\d+[TGM]?)?$")


# --------------------------------------------------------------------------- site settings

@dataclass
class SiteSettings:
    """Effective site values of one profile, with where each came from (default, file, env)."""

    profile: str
    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def accelerator(self) -> str:
        return "hpu" if self.profile == "gaudi" else "gpu"

    def default_resources(self) -> dict[str, str]:
        """Site part of ``default-resources`` (strings quoted for Snakemake's expression parser)."""
        out = {}
        for resource, key in (("slurm_partition", "partition"), ("slurm_account", "account"),
                              ("qos", "qos"), ("constraint", "constraint")):
            if self.values.get(key):
                out[resource] = _quote(self.values[key])
        return out

    def accelerator_resources(self, rules: Iterable[str] = ACCELERATOR_RULES, count: int = 1) -> dict[str, dict]:
        """``set-resources`` of the accelerator rules: GPU partition and constraint; on Gaudi the GRES
        (``count`` cards: every accelerator rule declares ``hpu=1``); the GPU type if one is set."""
        per_rule: dict[str, str] = {}
        partition = self.values.get("gpu_partition") or self.values.get("partition")
        if partition:
            per_rule["slurm_partition"] = _quote(partition)
        constraint = self.values.get("gpu_constraint") or self.values.get("constraint")
        if constraint:
            per_rule["constraint"] = _quote(constraint)
        if self.accelerator == "hpu":
            per_rule["gres"] = _quote(f"{self.values['gres_name']}:{count}")
        elif self.values.get("gpu_model"):
            per_rule["gpu_model"] = _quote(self.values["gpu_model"])
        return {rule: dict(per_rule) for rule in rules} if per_rule else {}

    def describe(self) -> str:
        width = max(len(k) for k in SITE_KEYS)
        lines = [f"site settings of profile {self.profile!r} (priority: env > file > default)"]
        for key, spec in SITE_KEYS.items():
            value = self.values.get(key)
            lines.append(f"  {key:<{width}} = {value!s:<14} [{self.sources.get(key, 'default')}]  "
                         f"{spec.env}: {spec.help}")
        return "\n".join(lines)


def _quote(value: Any) -> str:
    """A resource value Snakemake evaluates back to this exact string (``'all'`` stays a string)."""
    return repr(str(value))


def site_file(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(SITE_FILE_ENV):
        return Path(env[SITE_FILE_ENV]).expanduser()
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "counterfactory" / "cluster.yaml"


def _coerce(key: str, value: Any, origin: str) -> Any:
    spec = SITE_KEYS[key]
    if value is None or value == "":
        return None
    if spec.kind is int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ClusterConfigError(f"{origin}: {key} must be a whole number, got {value!r}") from None
        if number < 1:
            raise ClusterConfigError(f"{origin}: {key} must be at least 1, got {number}")
        return number
    text = str(value).strip()
    if any(c in text for c in "'\"\n"):
        raise ClusterConfigError(f"{origin}: {key} must not contain quotes or newlines, got {value!r}")
    return text


def _unknown_key(key: str, valid: Iterable[str], where: str, what: str = "key", list_valid: bool = True) -> str:
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = f". Valid: {', '.join(valid)}" if list_valid else ""
    return f"{where}: unknown {what} {key!r}{hint}{listing}"


def read_site_file(path: Path, profile: str) -> dict[str, Any]:
    """Values of the override file for ``profile``: top-level keys, then the profile's own section."""
    import yaml

    if not path.exists():
        return {}
    try:
        from .config import load_yaml     # a key given twice is an error, not a lost setting

        doc = load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ClusterConfigError(f"{path}: not valid YAML ({exc}). Fix the file or unset {SITE_FILE_ENV}") from exc
    if not isinstance(doc, dict):
        raise ClusterConfigError(f"{path}: expected a mapping of site keys, got {type(doc).__name__}")
    values: dict[str, Any] = {}
    sections = {name: doc.get(name) for name in REPO_PROFILES if isinstance(doc.get(name), dict)}
    for key, value in doc.items():
        if key in REPO_PROFILES and isinstance(value, dict):
            continue
        if key not in SITE_KEYS:
            raise ClusterConfigError(_unknown_key(key, [*SITE_KEYS, *REPO_PROFILES], str(path)))
        values[key] = value
    for key, value in (sections.get(profile) or {}).items():
        if key not in SITE_KEYS:
            raise ClusterConfigError(_unknown_key(key, SITE_KEYS, f"{path}, section {profile}"))
        values[key] = value
    return values


def site_settings(profile: str = "slurm", env: dict | None = None, check: bool | None = None,
                  run: Callable | None = None) -> SiteSettings:
    """Effective site settings of ``profile`` (``slurm`` or ``gaudi``). With ``check`` (default: yes,
    unless ``CF_SLURM_SKIP_CHECK=1``, inside a Slurm job, or Slurm's tools are absent) they are checked
    against the running cluster and a :class:`ClusterConfigError` lists every problem."""
    env = dict(os.environ if env is None else env)
    if profile not in REPO_PROFILES:
        raise ClusterConfigError(f"unknown profile {profile!r}; site settings exist for {', '.join(REPO_PROFILES)}")
    path = site_file(env)
    from_file = read_site_file(path, profile)
    values, sources = {}, {}
    for key, spec in SITE_KEYS.items():
        values[key], sources[key] = spec.default, "default"
        if key in from_file:
            values[key], sources[key] = _coerce(key, from_file[key], str(path)), str(path)
        if env.get(spec.env, "") != "":
            values[key], sources[key] = _coerce(key, env[spec.env], spec.env), spec.env
    if values["status_command"] not in ("squeue", "sacct"):
        raise ClusterConfigError(f"{sources['status_command']}: status_command must be squeue or sacct, "
                                 f"got {values['status_command']!r}")
    if values["gres_name"] and not re.fullmatch(r"[A-Za-z0-9_]+", values["gres_name"]):
        raise ClusterConfigError(f"{sources['gres_name']}: GRES name {values['gres_name']!r} may only hold "
                                 f"letters, digits and _ (the Slurm plugin's format)")
    site = SiteSettings(profile, values, sources)
    if check is None:
        check = should_check(env)
    if check:
        problems = cluster_problems(_placements_from_site(site), site.status_command, site.status_delay, run=run)
        if problems:
            hint = (f"(`counterfactory cluster show-site --profile {profile}` shows the settings; "
                    f"{SKIP_CHECK_ENV}=1 skips this check)")
            if len(problems) == 1:  # the common case (e.g. sinfo cannot reach the cluster): one line
                raise ClusterConfigError(f"profile {profile!r} does not fit this cluster: {problems[0]} {hint}")
            raise ClusterConfigError(f"profile {profile!r} does not fit this cluster:\n  - " + "\n  - ".join(problems)
                                     + f"\n{hint}")
    return site


def should_check(env: dict | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get(SKIP_CHECK_ENV, "") not in ("", "0"):
        return False
    if env.get("SLURM_JOB_ID"):  # inside a job: the submitting process already checked
        return False
    return shutil.which("sinfo", path=env.get("PATH")) is not None


# --------------------------------------------------------------------------- cluster checks

@dataclass
class Placement:
    """Where one class of jobs goes: ``rule`` is ``*`` for the defaults."""

    rule: str
    partition: str | None
    constraint: str | None = None
    accelerator: bool = False
    gres: str | None = None           # explicit GRES (gaudi), e.g. gpu:1
    gpu_model: str | None = None
    threads: int | None = None        # most CPUs one job of this class asks for
    origin: dict[str, str] = field(default_factory=dict)  # key -> where the value came from


def _placements_from_site(site: SiteSettings) -> list[Placement]:
    src = site.sources
    gpu_partition_key = "gpu_partition" if site.gpu_partition else "partition"
    return [
        Placement("*", site.partition, site.constraint, threads=site.max_threads,
                  origin={"partition": src["partition"], "threads": src["max_threads"]}),
        Placement("accelerator jobs", site.values[gpu_partition_key], site.gpu_constraint or site.constraint,
                  accelerator=True,
                  gres=f"{site.gres_name}:1" if site.accelerator == "hpu" else None,
                  gpu_model=site.gpu_model if site.accelerator == "gpu" else None, threads=site.max_threads,
                  origin={"partition": src[gpu_partition_key], "threads": src["max_threads"]}),
    ]


def _run(cmd: list[str], timeout: float = 20) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(cmd)}: timed out after {timeout:.0f} s"
    return proc.returncode, proc.stdout + proc.stderr


@dataclass
class ClusterInfo:
    partitions: dict[str, dict]  # name -> {"gres": {(name, type)}, "features": {...}, "cpus": most per node}
    default_partition: str | None


def cluster_info(run: Callable | None = None) -> ClusterInfo:
    """Partitions with their GRES (name, type) and node features, from one ``sinfo`` call."""
    run = run or _run
    rc, out = run(["sinfo", "--noheader", "--format=%P|%G|%f|%c"])
    if rc != 0:
        raise ClusterConfigError(f"sinfo failed (exit {rc}): {' '.join(out.split())[:300]}. Is Slurm reachable from "
                                 f"here? Start Snakemake on a login node of the cluster")
    parts: dict[str, dict] = {}
    default = None
    for line in out.splitlines():
        if line.count("|") not in (2, 3):
            continue
        name, gres, features, *cpus = line.strip().split("|")
        if name.endswith("*"):
            name = name[:-1]
            default = name
        entry = parts.setdefault(name, {"gres": set(), "features": set(), "cpus": 0})
        if cpus and re.match(r"\d+", cpus[0]):
            entry["cpus"] = max(entry["cpus"], int(re.match(r"\d+", cpus[0]).group()))
        for item in gres.split(","):
            item = re.sub(r"\(.*?\)", "", item).strip()
            if not item or item == "(null)":
                continue
            bits = item.split(":")
            gres_type = bits[1] if len(bits) == 3 else None
            entry["gres"].add((bits[0], gres_type))
        entry["features"].update(f for f in features.split(",") if f and f != "(null)")
    return ClusterInfo(parts, default)


def _min_job_age(run: Callable) -> int | None:
    rc, out = run(["scontrol", "show", "config"])
    if rc != 0:
        return None
    m = re.search(r"^MinJobAge\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m.group(1)) if m else None


def _feature_words(constraint: str) -> list[str]:
    """Plain feature names in a constraint expression (``a100&ib``, ``[rack1|rack2]``, ``gpu*2``)."""
    return [w for w in re.split(r"[&|\[\]()*,\s]+", constraint) if w and not w.isdigit()]


def cluster_problems(placements: list[Placement], status_command: str | None, status_delay: int | None,
                     run: Callable | None = None) -> list[str]:
    """Every way ``placements`` cannot run on the cluster ``sinfo`` describes, as fix-it sentences."""
    run = run or _run
    try:
        info = cluster_info(run)
    except ClusterConfigError as exc:
        return [str(exc)]
    names = sorted(info.partitions)
    found: dict[str, list[str]] = {}  # problem -> the job classes that have it

    class _Collect(list):
        def append(self, text: str) -> None:  # "who: problem" -> merged by problem
            who, _, problem = text.partition(": ")
            found.setdefault(problem, []).append(who)

    problems = _Collect()
    for p in placements:
        who = "every job" if p.rule == "*" else p.rule
        partition = p.partition or info.default_partition
        if p.partition and p.partition not in info.partitions:
            problems.append(f"{who}: partition {p.partition!r} (from {p.origin.get('partition', 'the profile')}) "
                            f"does not exist here; partitions: {', '.join(names) or 'none'}")
            continue
        if partition is None:
            problems.append(f"{who}: no partition set and the cluster has no default partition; "
                            f"set {SITE_KEYS['partition'].env} (partitions: {', '.join(names)})")
            continue
        offered = info.partitions[partition]
        if p.threads and offered.get("cpus") and p.threads > offered["cpus"]:
            problems.append(f"{who}: jobs may ask for {p.threads} CPUs (from {p.origin.get('threads', 'cores')}) but "
                            f"the nodes of partition {partition!r} have at most {offered['cpus']}; set "
                            f"{SITE_KEYS['max_threads'].env}={offered['cpus']}")
        if p.accelerator:
            wanted = (p.gres.split(":")[0] if p.gres else "gpu")
            gres_names = {n for n, _ in offered["gres"]}
            if wanted not in gres_names:
                have = ", ".join(sorted(f"{n}:{t}" if t else n for n, t in offered["gres"])) or "no GRES"
                problems.append(
                    f"{who}: partition {partition!r} offers no GRES {wanted!r} ({have}); set "
                    f"{SITE_KEYS['gpu_partition'].env} to a partition with accelerators"
                    + (f" or {SITE_KEYS['gres_name'].env} to its GRES name" if p.gres else "")
                    + f" (a `device: cpu` run needs none: {SKIP_CHECK_ENV}=1)")
            model = p.gpu_model or (p.gres.split(":")[1] if p.gres and p.gres.count(":") == 2 else None)
            if model and wanted in gres_names and (wanted, model) not in offered["gres"]:
                types = sorted(t for n, t in offered["gres"] if n == wanted and t)
                problems.append(f"{who}: partition {partition!r} has no {wanted} of type {model!r} "
                                f"(types: {', '.join(types) or 'none'}); fix {SITE_KEYS['gpu_model'].env}")
        if p.constraint:
            missing = [w for w in _feature_words(p.constraint) if w not in offered["features"]]
            if missing:
                problems.append(f"{who}: constraint {p.constraint!r} names features {', '.join(missing)} that no node "
                                f"of partition {partition!r} has (features: "
                                f"{', '.join(sorted(offered['features'])) or 'none'})")
    if status_command == "squeue" and status_delay:
        age = _min_job_age(run)
        if age is not None and age < 3 * status_delay:
            problems.append(f"status command squeue: the cluster forgets finished jobs after MinJobAge={age} s, less "
                            f"than 3 x {SITE_KEYS['status_delay'].env}={status_delay}; lower the delay to "
                            f"{max(1, age // 3)} or use CF_SLURM_STATUS_COMMAND=sacct (needs slurmdbd)")
    elif status_command == "sacct":
        rc, out = run(["sacct", "--noheader", "-X", "--starttime", "now", "--format=JobID"])
        if rc != 0:
            problems.append(f"status command sacct: it does not work here ({out.strip()[:200]}); without an "
                            f"accounting database use CF_SLURM_STATUS_COMMAND=squeue")
    return [f"{', '.join(dict.fromkeys(whos))}: {problem}" for problem, whos in found.items()]


# --------------------------------------------------------------------------- profile check

@dataclass
class ProfileReport:
    profile_file: Path | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def format(self) -> str:
        lines = [f"profile: {self.profile_file or '(not found)'}"]
        lines += [f"  error: {m}" for m in self.errors]
        lines += [f"  warning: {m}" for m in self.warnings]
        lines += [f"  note: {m}" for m in self.notes]
        lines.append("  OK" if self.ok else f"  {len(self.errors)} problem(s)")
        return "\n".join(lines)


def resolve_profile(profile: str) -> tuple[Path, Path] | None:
    """``(folder, config file)`` of a profile, found as Snakemake finds it: ``profiles/NAME`` of this workflow
    (``--workflow-profile NAME``); else a path; else NAME in the working directory, $XDG_CONFIG_HOME/snakemake or
    /etc/xdg/snakemake (``--profile NAME``)."""
    from snakemake.cli import get_profile_dir

    # a bare name of this workflow's profiles: its folder under profiles/ (the repository root's `slurm` and
    # `gaudi` links, which `snakemake --profile NAME` finds there, lead to the same folder)
    ours = PROFILE_DIR / profile
    if os.sep not in profile and ours.is_dir() and (not os.path.exists(profile)
                                                   or Path(profile).resolve() == ours.resolve()):
        profile = str(ours)
    found = get_profile_dir(profile)
    return (Path(found[0]), Path(found[1])) if found else None


def workflow_rules(snakefile: str | Path | None = None) -> dict[str, dict]:
    """Rule names of the workflow with their ``group`` and whether they declare an accelerator, read
    from the Snakefile, every ``include:``d file and the studies' ``rules/study_<study>.smk`` (static text; no DAG
    is built); ``use rule ... as``
    variants count with their base rule's settings."""
    snakefile = Path(snakefile) if snakefile else PROFILE_DIR.parent / "Snakefile"
    rules: dict[str, dict] = {}
    seen: set[Path] = set()

    def read(path: Path) -> None:
        if path in seen or not path.exists():
            return
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        for inc in re.findall(r'^include:\s*["\'](.+?)["\']', text, re.MULTILINE):
            read((path.parent / inc).resolve())
        blocks = re.split(r"^(?=(?:rule|checkpoint) \w+:)", text, flags=re.MULTILINE)
        for block in blocks:
            m = re.match(r"(?:rule|checkpoint) (\w+):", block)
            if not m:
                continue
            body = block.split("\n\n\n")[0]
            group = re.search(r'^\s+group:\s*\n?\s*["\'](\w+)["\']', body, re.MULTILINE)
            rules[m.group(1)] = {
                "group": group.group(1) if group else None,
                "accelerator": bool(re.search(r"^\s+(gpu|hpu)=", body, re.MULTILINE)),
            }

    read(snakefile.resolve())
    # the studies' rule files, which the Snakefile includes in a loop over counterfactory.studies.specs() (each
    # study's rules/study_<study>.smk, docs/architecture.md "Adding a study"): no static include line names them
    for path in sorted((snakefile.resolve().parent / "rules").glob("study_*.smk")):
        if not path.stem.endswith("_inputs"):
            read(path.resolve())
    # `use rule BASE as NAME with:` variants inherit the base rule's group and resources
    for path in seen:
        for base, name in re.findall(r"^use rule (\w+) as (\w+)", path.read_text(encoding="utf-8"), re.MULTILINE):
            if base in rules:
                rules[name] = dict(rules[base])
    return rules


def _option_names() -> set[str]:
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    return {s[2:] for action in parser._actions for s in action.option_strings if s.startswith("--")}


def _split_assignment(entry: str) -> tuple[str, str]:
    name, _, value = entry.partition("=")
    return name.strip(), value.strip()


def _literal(value: str) -> str:
    """A profile resource value as the string it stands for (quotes removed)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def check_profile(profile: str, snakefile: str | Path | None = None, live: bool | None = None,
                  run: Callable | None = None) -> ProfileReport:
    """Check a Snakemake profile (name or folder) against Snakemake's options, the workflow's rules
    and groups, the Slurm plugin's rules, and -- ``live`` -- the running cluster."""
    from snakemake.profiles import ProfileConfigFileParser

    found = resolve_profile(profile)
    if found is None:
        return ProfileReport(None, errors=[
            f"profile {profile!r} not found: it is no folder, no profile of this workflow ({PROFILE_DIR}: "
            f"{', '.join(sorted(p.name for p in PROFILE_DIR.iterdir() if p.is_dir()))}; what "
            f"`--workflow-profile NAME` reads) and not in the working directory, $XDG_CONFIG_HOME/snakemake or "
            f"/etc/xdg/snakemake (`--profile NAME`). Fix: pass the profile's folder, e.g. profiles/slurm"])
    _, config_file = found
    report = ProfileReport(config_file)
    global _DEFER_LIVE_CHECK
    _DEFER_LIVE_CHECK = True  # the profile's own site check is repeated below, collecting every problem
    try:
        with open(config_file, encoding="utf-8") as stream:
            parsed = ProfileConfigFileParser().parse(stream)
    except Exception as exc:  # YTE / YAML / our site settings
        report.errors.append(f"cannot load the profile: {exc}")
        return report
    finally:
        _DEFER_LIVE_CHECK = False

    options = _option_names()
    for key in parsed:
        if key not in options:
            report.errors.append(_unknown_key(key, options, "profile", list_valid=False)
                                 + ": not a Snakemake or Slurm-plugin option")

    rules = workflow_rules(snakefile)
    groups = {info["group"] for info in rules.values() if info["group"]}
    executor = str(parsed.get("executor", "local"))

    def check_resource(name: str, value: str, where: str) -> None:
        if name not in KNOWN_RESOURCES:
            report.errors.append(_unknown_key(name, KNOWN_RESOURCES, where, what="resource", list_valid=False))
        if name == "gres" and not GRES_RE.match(_literal(value)):
            report.errors.append(f"{where}: GRES {value!r} is not name, name:count or name:type:count "
                                 f"(letters, digits, _ and . only -- the Slurm plugin refuses e.g. HL-225)")
        if name == "slurm_extra":
            from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

            for pattern, what in get_forbidden_slurm_options().items():
                if re.search(pattern, _literal(value)):
                    report.errors.append(f"{where}: slurm_extra sets the {what} itself; the plugin refuses "
                                         f"that -- use the matching resource (gpu, gres, mem_mb, runtime, ...)")

    for entry in parsed.get("default-resources", []) or []:
        name, value = _split_assignment(entry)
        check_resource(name, value, "default-resources")
    per_rule: dict[str, dict[str, str]] = {}
    for entry in parsed.get("set-resources", []) or []:
        rule, _, assign = entry.partition(":")
        name, value = _split_assignment(assign)
        if rule not in rules:
            report.errors.append(_unknown_key(rule, rules, "set-resources", what="rule", list_valid=False))
        check_resource(name, value, f"set-resources of {rule}")
        per_rule.setdefault(rule, {})[name] = _literal(value)
    for entry in parsed.get("set-threads", []) or []:
        rule, _ = _split_assignment(entry)
        if rule not in rules:
            report.errors.append(_unknown_key(rule, rules, "set-threads", what="rule", list_valid=False))
    for entry in parsed.get("group-components", []) or []:
        group, _ = _split_assignment(entry)
        if group not in groups:
            report.errors.append(f"group-components: unknown group {group!r} (groups: {', '.join(sorted(groups))})")

    accel_rules = sorted(r for r, info in rules.items() if info["accelerator"])
    if executor == "slurm":
        try:
            import snakemake_executor_plugin_slurm  # noqa: F401
        except ImportError:
            report.errors.append("executor slurm: snakemake-executor-plugin-slurm is not installed "
                                 "(pinned in requirements.lock; `make venv`)")
        missing = [r for r in accel_rules if r not in per_rule]
        if per_rule and missing:
            report.warnings.append(f"accelerator rules without set-resources (they go to the default partition): "
                                   f"{', '.join(missing)}")
        status = parsed.get("slurm-status-command")
        if status is None:
            report.warnings.append("slurm-status-command not set: the plugin picks sacct when the binary exists, "
                                   "which hangs without an accounting database; set it (squeue) explicitly")

    if live is None:
        live = executor == "slurm" and should_check()
    if live:
        defaults = {_split_assignment(e)[0]: _literal(_split_assignment(e)[1])
                    for e in parsed.get("default-resources", []) or []}
        cores = int(parsed["cores"]) if str(parsed.get("cores", "")).isdigit() else None
        placements = [Placement("*", defaults.get("slurm_partition"), defaults.get("constraint"), threads=cores,
                                origin={"partition": "default-resources", "threads": "cores"})]
        for rule in accel_rules:
            res = {**defaults, **per_rule.get(rule, {})}
            placements.append(Placement(rule, res.get("slurm_partition"), res.get("constraint"), accelerator=True,
                                        gres=res.get("gres"), gpu_model=res.get("gpu_model"), threads=cores,
                                        origin={"partition": f"set-resources of {rule}", "threads": "cores"}))
        delay = parsed.get("slurm-init-seconds-before-status-checks")
        live_problems = cluster_problems(placements, parsed.get("slurm-status-command"),
                                         int(delay) if delay else 40, run=run)
        report.errors.extend(live_problems)
        if live_problems:
            report.notes.append(f"cluster checked with sinfo/scontrol; {SKIP_CHECK_ENV}=1 skips that "
                                f"(e.g. on a machine that is not a cluster login node)")
    elif executor == "slurm":
        report.notes.append("cluster not checked (no sinfo here, inside a job, or CF_SLURM_SKIP_CHECK=1)")
    return report


_DEFER_LIVE_CHECK = False


def profile_site(profile: str = "slurm") -> SiteSettings:
    """What the profiles call while Snakemake loads them: site settings, checked against the cluster
    unless :func:`check_profile` is loading the profile (it collects the problems itself).

    A problem ends Snakemake here with ``Error: <problem and fix>`` on stderr (one line per problem) and exit
    status 1: raised, it would reach Snakemake's argument parser (configargparse wraps every exception of a
    profile file as a parse error), which prints its whole usage text (~120 lines) before the message.
    ``SystemExit`` is no ``Exception``, so YTE, configargparse and Snakemake let it through unchanged."""
    if _DEFER_LIVE_CHECK:
        return site_settings(profile, check=False)
    try:
        return site_settings(profile)
    except ClusterConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
