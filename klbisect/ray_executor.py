"""Probes as Ray tasks (``--executor ray``; ``pip install klbisect[ray]``).

Each probe is one task that asks Ray for ``--gpus-per-probe`` GPUs (Ray sets
the task's ``CUDA_VISIBLE_DEVICES``). The task runs on whichever node has
them, in a clone that node keeps under a node-local cache directory: it
clones the repository on first use, fetches the commit by sha when the clone
lacks it, checks it out in a worktree of its own (reused by later tasks on
that node, so incremental builds stay valid), then builds and probes through
the same ``Measurer`` as the local executor. The ``Outcome`` and the text of
its logs travel back; the driver writes the logs under its own log directory
and records the runs, so no node touches the database.

Ray retries a task whose worker or node died (``max_retries``); a task that
still fails, or raises, comes back as a ``Failure``, which the session may
submit again. A measurement, whatever its value, is never retried here.

Where the repository comes from: ``KLBISECT_RAY_REPO`` (a path or URL every
node can reach), by default the path of the repository being bisected (right
for a single machine or a shared filesystem). Where nodes keep clones:
``KLBISECT_RAY_CACHE``, by default ``~/.cache/klbisect/ray`` on each node.
Nodes need klbisect (and the probe's own requirements) installed.
A builder that installs into the node's interpreter (--build sglang) records
it there before the session's first build, and the executor's close() puts
every node it used back.

``ray`` is imported only here and only when this executor is used.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pickle
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .executors import Failure, infrastructure_failure, port_bases, visible_gpus
from .measure import Measurer, Outcome
from .proc import private_log

RAY_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"   # where `ray start` leaves its address
MAX_NODE_WORKTREES = 64          # worktrees one node keeps per repository
LOG_RETURN_LIMIT = 4 << 20       # bytes of each log sent back (the tail)
DEFAULT_MAX_RETRIES = 2          # Ray's retries of a task whose worker/node died
ENV_FILE = "env_before.json"     # a node's interpreter before the session's first build there


def default_cache_dir() -> Path:
    return Path(os.environ.get("KLBISECT_RAY_CACHE") or Path.home() / ".cache" / "klbisect" / "ray")


def node_cache(cache_dir: str | None, repo_url: str) -> Path:
    """Where this node keeps its clone and worktrees of one repository."""
    base = Path(cache_dir) if cache_dir else default_cache_dir()
    return base / hashlib.sha256(repo_url.encode()).hexdigest()[:16]


@dataclass
class TaskSpec:
    """Everything a node needs to measure one commit; plain data, pickled by Ray."""

    sha: str
    repo_url: str
    cache_dir: str | None            # None: the node's default_cache_dir()
    gpus: int                        # --gpus-per-probe (Ray assigns which)
    probe: Any = None                # the driver's probe object, when it pickles
    builder: Any = None
    config: dict = field(default_factory=dict)   # BisectConfig fields, to rebuild probe/builder
    probe_key: str = ""
    build_key: str | None = None
    take_turns: bool = False         # one task at a time on a node (they share its Python's pinned wheels)


def _picklable(obj) -> bool:
    if obj is None:
        return True
    try:
        from ray import cloudpickle  # noqa: PLC0415
        cloudpickle.dumps(obj)
        return True
    except Exception:
        try:
            pickle.dumps(obj)
            return True
        except Exception:
            return False


# ---- on the node ---------------------------------------------------------------

def _git(cwd: Path, *args: str) -> str:
    import subprocess  # noqa: PLC0415
    p = subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")})
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed in {cwd}: {p.stderr.strip()[-500:]}")
    return p.stdout


def _has_commit(clone: Path, sha: str) -> bool:
    try:
        _git(clone, "cat-file", "-e", f"{sha}^{{commit}}")
        return True
    except RuntimeError:
        return False


def node_clone(repo_url: str, cache_dir: Path, sha: str) -> Path:
    """This node's clone of ``repo_url``, holding ``sha``. Call under the
    repository's node lock."""
    clone = cache_dir / "repo"
    if not (clone / ".git").exists():
        if clone.exists():
            import shutil  # noqa: PLC0415
            shutil.rmtree(clone)
        clone.parent.mkdir(parents=True, exist_ok=True)
        _git(clone.parent, "clone", "--quiet", "--no-checkout", "--", repo_url, str(clone))
    if not _has_commit(clone, sha):
        try:
            _git(clone, "fetch", "--quiet", "origin", sha)
        except RuntimeError:
            # servers that refuse a bare sha: fetch every branch and tag instead
            _git(clone, "fetch", "--quiet", "--tags", "origin", "+refs/heads/*:refs/remotes/origin/*")
        if not _has_commit(clone, sha):
            raise RuntimeError(f"commit {sha[:12]} is not reachable from {repo_url}; push it, or point "
                               "KLBISECT_RAY_REPO at a repository that has it")
    return clone


def _checkout(clone: Path, wt: Path, sha: str) -> None:
    if (wt / ".git").exists():
        try:
            _git(wt, "checkout", "--quiet", "--force", "--detach", sha)
            _git(wt, "clean", "-fdq", "-e", ".klbisect-keep")
            return
        except RuntimeError:
            import shutil  # noqa: PLC0415
            shutil.rmtree(wt, ignore_errors=True)
    _git(clone, "worktree", "prune")
    wt.parent.mkdir(parents=True, exist_ok=True)
    _git(clone, "worktree", "add", "--force", "--detach", str(wt), sha)


def _read_tail(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_RETURN_LIMIT))
            return f.read()
    except OSError:
        return None


def _make_probe_builder(spec: TaskSpec):
    probe, builder = spec.probe, spec.builder
    if probe is None:
        from .config import BisectConfig, make_builder, make_probe  # noqa: PLC0415
        cfg = BisectConfig.from_dict(spec.config)
        probe = make_probe(cfg)
        builder = make_builder(cfg)
        if probe.key != spec.probe_key or (builder.key if builder else None) != spec.build_key:
            raise RuntimeError("the probe rebuilt on this node is not the driver's probe "
                               "(different klbisect version on the node?)")
    return probe, builder


def run_task(spec: TaskSpec) -> dict:
    """Measure ``spec.sha`` on this node. Runs inside a Ray task (also
    callable directly, which the tests use)."""
    import filelock  # noqa: PLC0415
    import git  # noqa: PLC0415

    from .probe import Slot  # noqa: PLC0415
    from .proc import reap_stale  # noqa: PLC0415

    cache = node_cache(spec.cache_dir, spec.repo_url)
    cache.mkdir(parents=True, exist_ok=True)
    reap_stale(cache / "pids")

    # a worktree of our own among those this node keeps (held for the whole task;
    # the OS drops the lock if this worker dies)
    held = None
    for n in range(MAX_NODE_WORKTREES):
        lk = filelock.FileLock(str(cache / f"wt-{n}.lock"))
        try:
            lk.acquire(timeout=0)
        except filelock.Timeout:
            continue
        held = (n, lk)
        break
    if held is None:
        raise RuntimeError(f"all {MAX_NODE_WORKTREES} worktrees under {cache} are busy")
    n, wt_lock = held
    probe = None
    try:
        wt = cache / "wt" / str(n)
        with filelock.FileLock(str(cache / "repo.lock")):
            clone = node_clone(spec.repo_url, cache, spec.sha)
            _checkout(clone, wt, spec.sha)
        probe, builder = _make_probe_builder(spec)
        _node_origin(cache, builder)
        env: dict[str, str] = {}
        if spec.gpus > 0:
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            if cvd is None:
                import ray  # noqa: PLC0415
                cvd = ",".join(str(g) for g in ray.get_gpu_ids())
            env["CUDA_VISIBLE_DEVICES"] = cvd
        port_base = port_bases(1, start=int(cache.name[:4], 16) + n)[0]
        slot = Slot(n, wt, env, port_base, cache / "pids")
        # --build sglang where the range's pinned wheels change: the node's tasks take
        # turns in its one Python, and a worktree's own build stands only while it was the
        # last to install there (another's wheel may be in it now); named by host, since
        # home directories, where the cache lives, may be shared between nodes
        host = socket.gethostname()
        installed = cache.parent / f"one-python-{host}.installed"
        me = f"{cache}/wt-{n}"
        turns = (filelock.FileLock(str(cache.parent / f"one-python-{host}.lock")) if spec.take_turns
                 else contextlib.nullcontext())
        with turns:
            last_file = cache / f"wt-{n}.last_built"
            last = None
            if builder is not None and last_file.exists():
                key, _, sha = last_file.read_text().strip().partition(" ")
                last = sha if key == builder.key and sha else None
            if spec.take_turns and _read_text(installed) != me:
                last = None
            measurer = Measurer(git.Repo(str(clone)), probe, builder, cache / "logs", use_worktree=False,
                                last_built={str(wt): last})
            try:
                out = measurer.measure(spec.sha, slot)
            except BaseException:
                last_file.unlink(missing_ok=True)   # a half-finished build: rebuild next time
                if spec.take_turns:
                    installed.unlink(missing_ok=True)
                raise
            finally:
                _node_origin(cache, builder, keep=True)
            now = measurer.last_built.get(str(wt)) if builder is not None else None
            if builder is not None:
                if now:
                    last_file.write_text(f"{builder.key} {now}\n")
                else:
                    last_file.unlink(missing_ok=True)
            if spec.take_turns:
                if now:
                    installed.write_text(me)
                else:
                    installed.unlink(missing_ok=True)
        logs = {}
        for p in (out.build.log_path if out.build else None, out.run.log_path if out.run else None):
            data = _read_tail(p)
            if data is not None:
                logs[p] = data
        return {"outcome": out, "logs": logs, "node": socket.gethostname(), "worktree": n,
                "env": env, "node_id": _node_id()}
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            try:
                close()   # a server held for reuse must not outlive the task's GPUs
            except Exception:
                pass
        wt_lock.release()


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _node_id() -> str | None:
    try:
        import ray  # noqa: PLC0415
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - called directly, outside Ray
        return None


def _node_origin(cache: Path, builder, keep: bool = False) -> None:
    """A builder that installs into this node's interpreter (--build sglang)
    takes over what the node's first task found there, recorded before any
    build of this session, so the end of the session can put it back; with
    ``keep``, after a build, the pinned wheels it changed are added."""
    if not hasattr(builder, "adopt_origin"):
        return
    import filelock  # noqa: PLC0415
    path = cache / ENV_FILE
    with filelock.FileLock(str(cache / "env.lock")):
        if path.exists():
            builder.adopt_origin(json.loads(path.read_text()))   # the file's record comes first
        elif not keep:
            builder.remember_origin(cache / "logs")
        saved = builder.saved_origin()
        if saved is not None:
            path.write_text(json.dumps(saved))


def restore_node(cache_dir: str | None, repo_url: str, builder) -> list[str]:
    """End of a session on one node: put back the interpreter's sglang as
    the node's first task found it (one line saying so, or how to)."""
    import filelock  # noqa: PLC0415
    cache = node_cache(cache_dir, repo_url)
    path = cache / ENV_FILE
    with filelock.FileLock(str(cache / "env.lock")):
        if not path.exists():
            return []
        builder.adopt_origin(json.loads(path.read_text()))
        lines = builder.close(lambda line: None)
        path.unlink()
    return [f"{line} (on {socket.gethostname()})" for line in lines]


# ---- on the driver -----------------------------------------------------------------

@contextlib.contextmanager
def _keeping_signals() -> Iterator[None]:
    """ray.init installs its own SIGTERM handlers (the driver's, and a C++
    one that dumps stacks and aborts) and ray.shutdown resets them to the
    default: klbisect's are put back, so a cancelled CI job still unwinds to
    exit 130 with what it saved. (A SIGTERM while ray.init itself runs, a
    few seconds, still meets Ray's.)"""
    ours = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in ours.items():
            if handler is not None:
                try:
                    signal.signal(s, handler)
                except ValueError:    # not the main thread: nothing of ours was there to put back
                    pass


CANCEL_GRACE = 10.0   # seconds a cancelled task has to stop its probe (run_logged's TERM-then-KILL takes 5)


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray's notices while it starts (a local cluster's "Token authentication
    is enabled ...") are not klbisect's to print: its errors still raise."""
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415
    log = logging.getLogger("ray")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        # (a Ray Client timeout's UserWarning printed its source line: the error says it in one)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


ADDRESS_TIMEOUT = 5.0   # seconds to wait for a --ray-address to answer


def _no_ray():
    from .errors import EXIT_USAGE, KlbisectError  # noqa: PLC0415
    return KlbisectError("--executor ray needs Ray: pip install 'klbisect[ray]'", EXIT_USAGE)


def _check_address(address: str | None) -> None:
    """A --ray-address of host:port (or ray://host:port) where nothing
    listens: ray.init retries it for good and ignores Ctrl-C and SIGTERM."""
    from .errors import EXIT_USAGE, KlbisectError  # noqa: PLC0415
    # ray.init takes RAY_ADDRESS for no address or auto: a stale one hangs the same way
    # (auto itself is left to ray.init, which finds a cluster by more than one file and fails fast)
    given = f"--ray-address {address}"
    if not address or address == "auto":
        address, given = os.environ.get("RAY_ADDRESS"), f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"
    if not address or address in ("auto", "local"):
        return
    scheme, _, hostport = address.rpartition("://")
    host, _, port = hostport.rstrip("/").rpartition(":")
    if scheme not in ("", "ray") or not host or not port.isdigit():
        # (http://HOST:8265 is the dashboard's, for job submission: a tester's got Ray's text with its \n)
        raise KlbisectError(f"{given}: give HOST:PORT (the address `ray start --head` prints), "
                            "ray://HOST:10001 for Ray Client, or auto on a node of a running cluster", EXIT_USAGE)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_TIMEOUT) as conn:
            grpc = _speaks_grpc(conn)
    except OSError as e:
        raise KlbisectError(f"{given}: nothing answers at {host}:{port} ({e.strerror or e}); "
                            "start the cluster (`ray start --head` prints its address), or leave --ray-address "
                            "out for a cluster of this machine that klbisect starts", EXIT_USAGE) from None
    if grpc is False and os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
        # a tester's dashboard port (8265) and an HTTP server: ray.init waited on them for good, deaf to
        # Ctrl-C and SIGTERM
        raise KlbisectError(f"{given}: what answers at {host}:{port} is not a Ray cluster (no gRPC there: "
                            "the dashboard's port, 8265, or another server?); give the address `ray start --head` "
                            "prints (port 6379 by default), or ray://HOST:10001 for Ray Client", EXIT_USAGE)


def _speaks_grpc(conn: socket.socket) -> bool | None:
    """Whether the server at ``conn`` speaks HTTP/2, as Ray's GCS and Ray
    Client (gRPC) do: it answers the client preface with a SETTINGS frame.
    None when it says nothing in time (left to ray.init, as before)."""
    conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    got = b""
    try:
        while len(got) < 9:
            more = conn.recv(9 - len(got))
            if not more:
                break
            got += more
    except socket.timeout:
        return None if not got else False
    except OSError:
        return False
    return len(got) == 9 and got[3] == 4     # frame type 4: SETTINGS


def _cannot_connect(address: str | None, e: Exception):
    """ray.init's failure to reach or start a cluster: the address, not klbisect, is wrong."""
    from .errors import EXIT_USAGE, KlbisectError, shown  # noqa: PLC0415
    said = shown(f"{type(e).__name__}: {e}", one_line=True)
    auth = ("; the cluster asks for a token (Ray's token authentication): run klbisect where `ray status` "
            "reaches it" if any(w in str(e).lower() for w in ("authoriz", "token", "unauthenticated")) else "")
    where = f"--ray-address {address}" if address else "a Ray cluster of this machine"
    return KlbisectError(f"cannot connect to {where} ({said}){auth}; `ray status` there says whether it runs, "
                         "`ray start --head` starts one", EXIT_USAGE)


def _no_gpus_here(wanted: int, gpus: float) -> None:
    if wanted > gpus:
        from .errors import EXIT_USAGE, KlbisectError  # noqa: PLC0415
        raise KlbisectError(f"--gpus-per-probe {wanted} but the Ray cluster klbisect starts on this machine "
                            f"has {gpus:g} GPUs: lower --gpus-per-probe, or give --ray-address of a cluster "
                            "that has them", EXIT_USAGE)


class RayExecutor:
    """The executor interface (``slots``, ``free``, ``submit``, ``wait``,
    ``in_flight``, ``close``) over Ray tasks."""

    def __init__(self, parallel: int, gpus_per_probe: int, repo_url: str, log_dir: Path,
                 probe=None, builder=None, config: dict | None = None, probe_key: str = "",
                 build_key: str | None = None, cache_dir: str | None = None,
                 num_cpus: float = 1, max_retries: int = DEFAULT_MAX_RETRIES, owns_ray: bool = False,
                 take_turns: bool = False):
        import ray  # noqa: PLC0415

        self._ray = ray
        self.slots = parallel
        self.gpus = gpus_per_probe
        self.log_dir = Path(log_dir)
        self._owns_ray = owns_ray
        send = _picklable(probe) and _picklable(builder)
        self._template = TaskSpec("", repo_url, cache_dir, gpus_per_probe,
                                  probe if send else None, builder if send else None,
                                  dict(config or {}), probe_key, build_key, take_turns)
        self._remote = ray.remote(run_task).options(
            num_gpus=gpus_per_probe if gpus_per_probe > 0 else 0, num_cpus=num_cpus,
            max_retries=max_retries, retry_exceptions=False, name="klbisect-probe",
            # taking turns on a node: spread the tasks over nodes rather than queue them on one
            scheduling_strategy="SPREAD" if take_turns else "DEFAULT")
        self._refs: dict[Any, tuple[str, int]] = {}   # ref -> (sha, logical slot)
        self.task_info: list[dict] = []               # node, worktree, env of each finished task
        self._builder = builder if hasattr(builder, "adopt_origin") else None
        self._nodes: set[str] = set()                 # Ray node ids whose interpreter a build may have changed

    @staticmethod
    def refuse_before_session(cfg) -> None:
        """What is plainly wrong, refused before any session is recorded (a
        tester's failed starts each left one "not running now"): Ray not
        installed, a --ray-address where nothing answers (ray.init waits
        there for good, deaf to Ctrl-C), and GPUs that the cluster klbisect
        would start on this machine cannot have."""
        if importlib.util.find_spec("ray") is None:
            raise _no_ray()
        _check_address(cfg.ray_address)
        RayExecutor.refuse_missing_gpus(cfg)

    @staticmethod
    def refuse_missing_gpus(cfg) -> None:
        """Refuse GPUs that the cluster klbisect would start on this machine
        cannot have: it sees this machine's GPUs (CUDA_VISIBLE_DEVICES as
        well), and never gains one. Without Ray started or imported: that is
        the executor's to do, as is a cluster it is given or finds (`ray start`)."""
        ray = sys.modules.get("ray")
        if (cfg.gpus_per_probe <= 0 or cfg.ray_address or os.environ.get("RAY_ADDRESS")
                or (ray is not None and ray.is_initialized()) or Path(RAY_CURRENT_CLUSTER).exists()):
            # (ray.init attaches to a cluster `ray start` began on this machine, whose GPU nodes
            # may be elsewhere: the executor counts those)
            return
        _no_gpus_here(cfg.gpus_per_probe, len(visible_gpus()))

    @classmethod
    def from_config(cls, cfg, ws, measurer: Measurer, take_turns: bool = False) -> "RayExecutor":
        try:
            import ray  # noqa: PLC0415
        except ImportError:
            raise _no_ray() from None
        owns = False
        if not ray.is_initialized():
            _check_address(cfg.ray_address)
            with _keeping_signals(), _quiet_ray():
                try:
                    ray.init(address=cfg.ray_address or None, ignore_reinit_error=True,
                             log_to_driver=False, configure_logging=False)
                except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
                    raise _cannot_connect(cfg.ray_address, e) from None
                except SystemExit as e:
                    if e.code not in (signal.SIGTERM, -signal.SIGTERM):
                        raise
                    # Ray's SIGTERM handler while it starts a cluster (a tester's exit 15, no line):
                    # klbisect's own stop, exit 130 with what it saved
                    with contextlib.suppress(Exception):
                        ray.shutdown()
                    raise KeyboardInterrupt from None
            owns = True
        gpus = float(ray.cluster_resources().get("GPU", 0))
        if cfg.gpus_per_probe > gpus and owns and not (cfg.ray_address or os.environ.get("RAY_ADDRESS")):
            # a cluster of this machine alone, started here, never gains GPUs: the probes would
            # wait forever (a tester's CI job hung; the local executor refuses the same at once)
            with _keeping_signals():
                ray.shutdown()
            _no_gpus_here(cfg.gpus_per_probe, gpus)
        if cfg.gpus_per_probe > gpus:
            # not an error: an autoscaling cluster may add GPU nodes on demand
            import sys  # noqa: PLC0415
            print(f"klbisect: warning: --gpus-per-probe {cfg.gpus_per_probe} but the Ray cluster has "
                  f"{gpus:g} GPUs now; probes wait until Ray can place them", file=sys.stderr, flush=True)
        repo_url = os.environ.get("KLBISECT_RAY_REPO") or str(ws.top)
        builder = measurer.builder
        return cls(cfg.parallel, cfg.gpus_per_probe, repo_url, measurer.log_dir,
                   probe=measurer.probe, builder=builder, config=_config_dict(cfg),
                   probe_key=measurer.probe.key, build_key=builder.key if builder else None,
                   cache_dir=os.environ.get("KLBISECT_RAY_CACHE") or None, owns_ray=owns,
                   take_turns=take_turns)

    def free(self) -> int:
        return self.slots - len(self._refs)

    def in_flight(self) -> list[str]:
        return [sha for sha, _ in self._refs.values()]

    def submit(self, sha: str) -> None:
        if self.free() <= 0:
            raise RuntimeError("no free slot: call wait() first")
        used = {s for _, s in self._refs.values()}
        slot = min(i for i in range(self.slots) if i not in used)
        spec = TaskSpec(sha, **{k: getattr(self._template, k) for k in
                                ("repo_url", "cache_dir", "gpus", "probe", "builder", "config",
                                 "probe_key", "build_key", "take_turns")})
        self._refs[self._remote.remote(spec)] = (sha, slot)

    def _collect(self, ref, sha: str, slot: int) -> Outcome | Failure:
        ray = self._ray
        try:
            res = ray.get(ref)
        except ray.exceptions.TaskCancelledError as e:
            return Failure(sha, slot, f"ray task cancelled: {e}")
        except ray.exceptions.RayError as e:   # task raised, worker/node died, object lost
            first = str(e).strip().splitlines()
            return Failure(sha, slot, f"{type(e).__name__}: {first[-1] if first else e}")
        except Exception as e:  # noqa: BLE001 - e.g. unpickling the result
            return Failure(sha, slot, f"{type(e).__name__}: {e}")
        out: Outcome = res["outcome"]
        out.slot = slot
        self._localize_logs(out, res.get("logs") or {}, res.get("node", "?"))
        if res.get("node_id"):
            self._nodes.add(res["node_id"])
        self.task_info.append({"sha": sha, "slot": slot, "node": res.get("node"),
                               "worktree": res.get("worktree"), "env": res.get("env", {})})
        why = infrastructure_failure(out)
        return Failure(sha, slot, f"on {res.get('node')}: {why}", out) if why else out

    def _localize_logs(self, out: Outcome, logs: dict[str, bytes], node: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)

        def local(path: str) -> str:
            if path not in logs:
                return f"{node}:{path}"
            dest = self.log_dir / Path(path).name
            with private_log(dest) as f:
                f.write(logs[path])
            return str(dest)
        if out.build is not None and out.build.log_path:
            out.build.log_path = local(out.build.log_path)
        if out.run is not None and out.run.log_path:
            out.run.log_path = local(out.run.log_path)

    def wait(self, timeout: float | None = None) -> list[Outcome | Failure]:
        """Every finished task, blocking until there is one (in short slices,
        so Ctrl-C reaches us). [] at once when nothing is in flight."""
        ray = self._ray
        if not self._refs:
            return []
        start = time.monotonic()
        while True:
            ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=0.5)
            if ready:
                break
            if timeout is not None and time.monotonic() - start >= timeout:
                return []
        ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
        out = []
        for ref in ready:
            sha, slot = self._refs.pop(ref)
            out.append(self._collect(ref, sha, slot))
        return out

    def close(self) -> None:
        ray = self._ray
        refs = list(self._refs)
        # A task cancelled with force is its worker killed, and the probe it ran, a process
        # group of its own, was left running (a tester's Ctrl-C left both slots' probes and
        # their servers behind). A plain cancel is a KeyboardInterrupt in the task, on which
        # run_logged stops the probe's whole tree; force only for those it does not end.
        for ref in refs:
            try:
                ray.cancel(ref, force=False)
            except Exception:
                pass
        pending, deadline = refs, time.monotonic() + CANCEL_GRACE
        if refs:
            print(f"klbisect: stopping {len(refs)} Ray task(s) and their probes (up to {CANCEL_GRACE:g} s)",
                  file=sys.stderr, flush=True)
        while pending and time.monotonic() < deadline:
            try:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            except (Exception, KeyboardInterrupt):   # a second Ctrl-C: on to force, not out of close
                break
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        self._refs.clear()
        self._restore_nodes()
        if self._owns_ray and ray.is_initialized():
            with _keeping_signals():
                ray.shutdown()
            self._owns_ray = False
        if pending:
            # this machine's node: the probes of the workers killed above, found by their pid
            # files once those workers are gone (a kill Ray sends, not one it waits for)
            from .proc import reap_stale  # noqa: PLC0415
            pids, end = node_cache(self._template.cache_dir, self._template.repo_url) / "pids", time.monotonic() + 3
            while True:
                reap_stale(pids)
                if time.monotonic() > end or not any(pids.glob("*.pid")):
                    break
                time.sleep(0.2)

    def _restore_nodes(self) -> None:
        """--build sglang installed each worktree into its node's interpreter:
        one task per node puts that back, as `run` does on its own machine."""
        nodes, self._nodes = self._nodes, set()
        if self._builder is None or not nodes:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415
        ray, t = self._ray, self._template
        task = ray.remote(restore_node)
        refs = {task.options(num_cpus=0, max_retries=0, name="klbisect-restore-env",
                             scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(t.cache_dir, t.repo_url, self._builder): node for node in sorted(nodes)}
        for ref, node in refs.items():
            try:
                lines = ray.get(ref, timeout=self._builder.timeout)
            except Exception as e:  # noqa: BLE001 - the session is ending: say what to do, never mask its error
                lines = [f"klbisect: could not put back the sglang of Ray node {node} "
                         f"({type(e).__name__}: {e}); reinstall it there"]
            for line in lines:
                print(line, file=sys.stderr, flush=True)


def _config_dict(cfg) -> dict:
    from dataclasses import asdict  # noqa: PLC0415
    d = asdict(cfg)
    d["build_paths"] = list(cfg.build_paths)
    return d
