"""The Kubernetes manifests in docker/k8s/ are valid YAML of the kinds their operators take, open
with what they do and the exact kubectl command, and run commands that exist here. No cluster is
needed (none was available where they were written)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is missing (pip install pyyaml)")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"


def load(name: str) -> dict:
    docs = list(yaml.safe_load_all((K8S / name).read_text()))
    assert len(docs) == 1 and isinstance(docs[0], dict), name
    return docs[0]


def header(name: str) -> str:
    """The comment the file opens with."""
    lines = []
    for line in (K8S / name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def containers(replica: dict) -> list:
    return replica["template"]["spec"]["containers"]


def command_words(container: dict) -> list:
    command = container["command"]
    return shlex.split(command[-1]) if command[0] == "bash" else command


def check_command(words: list) -> None:
    """Every repository file the command names exists, and the example takes its flags."""
    scripts = [w for w in words if w.startswith("examples/")]
    assert scripts, words
    for script in scripts:
        assert (ROOT / script).is_file(), script
        flags = [w for w in words[words.index(script) + 1:] if w.startswith("--")]
        text = (ROOT / script).read_text()
        assert all(f'"{f}"' in text for f in flags), (script, flags)


@pytest.mark.parametrize("name", ["pytorchjob.yaml", "mpijob.yaml"])
def test_opens_with_what_it_does_and_how_to_apply_it(name):
    text = header(name)
    assert f"kubectl apply -f docker/k8s/{name}" in text
    assert "docker build -f docker/Dockerfile.cpu" in text and "horovodlite:cpu" in text


def test_pytorchjob_runs_torchrun_in_the_cpu_image():
    job = load("pytorchjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"]["name"] and int(job["spec"]["nprocPerNode"]) >= 1
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    for spec in replicas.values():
        (container,) = containers(spec)
        assert container["name"] == "pytorch"  # the name the training operator expects
        assert container["image"].endswith("horovodlite:cpu")
        words = command_words(container)
        assert words[0] == "torchrun"
        check_command(words)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_mpijob_v2beta1_has_a_launcher_and_workers_of_matching_size():
    job = load("mpijob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert spec["mpiImplementation"] == "OpenMPI" and spec["slotsPerWorker"] >= 1
    replicas = spec["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"} and replicas["Launcher"]["replicas"] == 1
    (launcher,) = containers(replicas["Launcher"])
    words = command_words(launcher)
    run = words[words.index("horovodliterun"):]
    np = int(run[run.index("-np") + 1])
    assert np == spec["slotsPerWorker"] * replicas["Worker"]["replicas"]
    assert run[run.index("--hostfile") + 1] == "/etc/mpi/hostfile"
    check_command(run)
    (worker,) = containers(replicas["Worker"])
    assert "/usr/sbin/sshd -De" in worker["command"][-1]
    assert spec["sshAuthMountPath"] == "/root/.ssh"  # root's: both containers run as root
    assert all(c["securityContext"]["runAsUser"] == 0 for c in (launcher, worker))
    assert "openssh-server" in (ROOT / "docker" / "Dockerfile.cpu").read_text()
