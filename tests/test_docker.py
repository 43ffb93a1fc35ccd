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
DOCKERFILES = ["Dockerfile.preprocess", "Dockerfile.preprocess-gpu", "Dockerfile.train",
               "Dockerfile.serving"]

sys.path.insert(0, str(DOCKER))
import pins  # noqa: E402  (docker/pins.py: the build's reader of pyproject.toml)


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
        rest = json.loads(instruction.args[instruction.args.index("["):])
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
                    problems.append(f"line {instruction.line}: {keyword} of a URL ({source}); "
                                    "download in a RUN step with a checksum instead")
                    continue
                matches = glob.glob(str(repo / source))
                if not matches:
                    problems.append(f"line {instruction.line}: {source} does not exist in the repo")
                    continue
                rel = PurePosixPath(source.rstrip("/"))
                is_dir = (repo / rel).is_dir()
                landed = target_dir if is_dir else (
                    target_dir / rel.name if dest.endswith("/") or len(sources) > 1 else target_dir)
                if landed != PROJECT_DIR / rel:
                    problems.append(f"line {instruction.line}: {source} lands at {landed}, not at "
                                    f"{PROJECT_DIR / rel} (the repo layout the scripts expect)")
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
            problems.append(f"ARG {name}={default}: a pinned version must come from pyproject.toml "
                            "(declare the ARG without a value; docker/build.sh passes it)")
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
                problems.append(f"line {instruction.line}: tensorflow image {version}, "
                                f"pyproject pins {every_pin['tensorflow']}")
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
    proc = subprocess.run(["bash", str(script), *argv[1:]], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "--frequency-threshold" in proc.stdout and "--master" in proc.stdout


def test_serving_image_is_tensorflow_serving_of_the_pin_and_checks_the_model(tmp_path):
    """FROM tensorflow/serving:<the TensorFlow pin>; the entrypoint refuses a missing model in
    one line and otherwise starts tensorflow_model_server on the mounted version."""
    dockerfile = load("Dockerfile.serving")
    assert dockerfile.of("FROM")[-1].args == "tensorflow/serving:${TENSORFLOW_VERSION}"
    script = DOCKER / "serving" / "entrypoint.sh"
    env = {"MODEL_BASE_PATH": str(tmp_path / "models")}
    proc = _script([script], tmp_path, **env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no SavedModel" in proc.stderr
    (tmp_path / "models" / "dlrm" / "1").mkdir(parents=True)
    (tmp_path / "models" / "dlrm" / "1" / "saved_model.pb").write_bytes(b"")
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    config = tmp_path / "models.config"
    proc = _script([script, "--rest_api_timeout_in_ms=5000"], tmp_path, **env,
                   SERVING_MODEL_CONFIG=str(config), PATH=f"{fake.parent}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["--port=8500", "--rest_api_port=8501",
                                        f"--model_config_file={config}",
                                        "--model_config_file_poll_wait_seconds=30",
                                        "--rest_api_timeout_in_ms=5000"]
    # no serving.json (an export made before it): the newest version, as before
    text = config.read_text()
    assert f'base_path: "{tmp_path / "models" / "dlrm"}"' in text and 'name: "dlrm"' in text
    assert "latest { num_versions: 1 }" in text


def test_serving_entrypoint_follows_the_served_version_without_a_restart(tmp_path):
    """The served version of serving.json (a rollback, an export) becomes the server's model
    config, and a change of it is written again while the server runs."""
    from dlrm_contracts.serving_state import ServingState, write_state

    export = tmp_path / "models" / "dlrm"
    for version in (1, 2, 3):
        (export / str(version)).mkdir(parents=True)
        (export / str(version) / "saved_model.pb").write_bytes(b"")
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
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "MODEL_BASE_PATH": str(tmp_path / "models"),
           "SERVING_MODEL_CONFIG": str(config), "SERVING_POLL_SECONDS": "1"}
    child = subprocess.Popen(["bash", str(DOCKER / "serving" / "entrypoint.sh")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    for _ in range(600):
        if ready.exists() or child.poll() is not None:
            break
        time.sleep(0.1)
    write_state(export, ServingState(held=1))  # `export rollback 1`
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    first, _, then = out.partition("}\n}\n")
    assert "specific { versions: 2 }" in first and "specific { versions: 1 }" in then, out


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
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1",
                    "HOROVOD_WITH_TENSORFLOW=1", "CMAKE_POLICY_VERSION_MINIMUM=3.5", '"cmake<4"',
                    r"/xla_mpi_ops\.cc/d"):
        assert setting in script, setting
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
    assert dockerfile.of("FROM")[0].args == "${CUDA_BASE_IMAGE}"


# ---------------------------------------------------------------- build.sh and pins.py
def test_build_script_passes_every_version_arg_the_dockerfiles_declare():
    out = subprocess.run(["bash", str(DOCKER / "build.sh"), "--print", "all"], capture_output=True,
                         text=True, check=True, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                                                     "PYTHON": sys.executable}).stdout
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
    declared = project["dependencies"] + [r for group in project["optional-dependencies"].values()
                                          for r in group]
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
        'ENTRYPOINT ["python", "-m", "no_such_module"]\n')
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
    return subprocess.run(["bash", *map(str, argv)], capture_output=True, text=True, timeout=60,
                          env=full, cwd=tmp_path)


@pytest.mark.parametrize("args", [["--dir"], ["--workers"], ["--port", "abc"], ["--port", "70000"],
                                  ["--workers", "two"], ["--worker-memory", "4"],
                                  ["--timeout", "x"]])
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
    spark_home = tmp_path / "spark"
    (spark_home / "bin").mkdir(parents=True)
    (spark_home / "bin" / "spark-submit").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (spark_home / "bin" / "spark-submit").chmod(0o755)
    python = tmp_path / "python"
    python.write_text(f"#!/usr/bin/env bash\necho {spark_home}\n")
    python.chmod(0o755)
    (tmp_path / "cl").mkdir()
    (tmp_path / "cl" / "cluster.env").write_text("MASTER_URL=spark://h:7077\n")
    submit = DOCKER / "spark-cluster" / "submit.sh"
    proc = _script([submit, "--dir", tmp_path / "cl", "--", "--input", "x", "--master=local[1]"],
                   tmp_path, PYTHON=str(python))
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
    script.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n'
                      'echo "SPARK_LOCAL_IP=$SPARK_LOCAL_IP"\n')
    script.chmod(0o755)
    return home


def _daemon(tmp_path: Path, *args: str):
    root = [] if os.geteuid() else ["--allow-root"]  # this test may run as root
    return _script([DOCKER / "spark" / "entrypoint.sh", *args, *root, "--dir", tmp_path / "auth"],
                   tmp_path, SPARK_HOME=str(_fake_spark_home(tmp_path)),
                   PYTHONPATH=str(REPO))


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
    proc = _daemon(tmp_path, "worker", "spark://10.1.2.3:7077", "--host", "10.1.2.4",
                   "--secret-file", str(secret_file), "--cores", "3", "--memory", "2g")
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.splitlines()
    assert argv[0] == "org.apache.spark.deploy.worker.Worker" and "spark://10.1.2.3:7077" in argv
    assert argv[argv.index("--host") + 1] == "10.1.2.4" and "SPARK_LOCAL_IP=127.0.0.1" in argv
    conf = Path(argv[argv.index("--properties-file") + 1])
    assert (conf.stat().st_mode & 0o777) == 0o600 and conf.parent == tmp_path / "auth"
    settings = set(conf.read_text().splitlines())
    assert {"spark.authenticate true", f"spark.authenticate.secret {secret}",
            "spark.network.crypto.enabled true", "spark.master.rest.enabled false",
            "spark.ui.killEnabled false", "spark.acls.enable true"} <= settings
    assert secret not in proc.stdout + proc.stderr
    proc = _daemon(tmp_path, "master", "--host", "10.1.2.3", "--insecure")
    assert proc.returncode == 0 and "WITHOUT authentication" in proc.stderr
    for bad in (["worker", "--host", "10.1.2.4"], ["worker", "nowhere", "--host", "h"],
                ["master", "--host", "10.1.2.3", "--port", "99999"],
                ["master", "--host", "10.1.2.3", "--secret-file", str(secret_file),
                 "--no-rpc-encryption"], ["master", "--bogus"]):
        proc = _daemon(tmp_path, *bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (bad, proc.stderr)


def test_image_daemons_refuse_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to check the refusal of root")
    proc = subprocess.run([sys.executable, "-m", "pipeline.cluster_auth", "master", "--host",
                           "127.0.0.1"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "not as root" in proc.stderr and "--allow-root" in proc.stderr
