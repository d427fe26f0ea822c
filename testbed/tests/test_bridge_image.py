"""The bridge's container image (`make package`: dist/bridge/), read back the way a
registry and a kubelet's runtime read it (testbed/oci_layout.py, independent of
tools/oci.py, which writes it), and run as a runtime runs it: in a root filesystem made of
nothing but its layers, with the /etc/hosts Kubernetes mounts, against a real Valkey.

There is no container runtime on this machine (no docker engine, no root): `unshare -r
chroot` stands in for one, so the image's own files are all the binary has, but it runs
as the namespace's root rather than as the image's user, which the config is checked for."""

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
from pathlib import Path

import yaml

from testbed.oci_layout import Layout
from testbed.stack import VALKEY, free_port, request, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
DIST = ROOT / "dist"
BRIDGE = DIST / "bridge"
LAYOUT = BRIDGE / "oci"
PT_INTERP = 3


def version():
    text = (ROOT / "bridge" / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def files(layout):
    """The image's regular files: path -> (tar member, bytes)."""
    return {m.name: (m, data) for m, data in layout.members() if m.isfile()}


def entrypoint(layout):
    (path,) = layout.config["config"]["Entrypoint"]
    return path


def is_static_elf(binary):
    """An x86-64 ELF executable without a program interpreter: nothing to load it but the
    kernel, so it needs no C library in the image."""
    assert binary[:4] == b"\x7fELF" and binary[4] == 2 and binary[5] == 1, "not ELF64 LE"
    machine, = struct.unpack_from("<H", binary, 18)
    assert machine == 62, machine  # EM_X86_64
    phoff, = struct.unpack_from("<Q", binary, 32)
    phentsize, phnum = struct.unpack_from("<HH", binary, 54)
    kinds = [struct.unpack_from("<I", binary, phoff + i * phentsize)[0] for i in range(phnum)]
    return PT_INTERP not in kinds


def test_a_runtime_finds_a_static_binary_run_by_a_non_root_user_and_nothing_else():
    layout = Layout(LAYOUT)
    config = layout.config
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert layout.descriptor["annotations"]["org.opencontainers.image.ref.name"] == version()
    user = config["config"]["User"]
    # Numeric, so that a pod's runAsNonRoot can verify it without an /etc/passwd.
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0 and int(gid) != 0, user
    image_files = files(layout)
    path = entrypoint(layout).lstrip("/")
    member, binary = image_files[path]
    assert binary == (BRIDGE / "ratelimit-bridge").read_bytes()
    assert is_static_elf(binary)
    # Root's, executable by all, writable by nobody else: the user cannot replace it.
    assert (member.uid, member.gid) == (0, 0)
    assert member.mode & 0o111 == 0o111 and member.mode & 0o022 == 0, oct(member.mode)
    # No shell, no other program: the only other file is the CA bundle.
    ca_member, ca = image_files.pop("etc/ssl/certs/ca-certificates.crt")
    assert ca.count(b"-----BEGIN CERTIFICATE-----") > 100
    assert not ca_member.mode & 0o111
    assert set(image_files) == {path}
    # Envoy Gateway runs envoyproxy/ratelimit's image by its binary's path.
    links = {m.name: m.linkname for m, _ in layout.members() if m.issym()}
    assert links == {"bin/ratelimit": "/" + path}, links
    assert not any(m.islnk() for m, _ in layout.members())


def test_every_blob_is_referenced_and_the_archive_is_the_layout():
    layout = Layout(LAYOUT)
    assert layout.stored() == layout.referenced()
    assert layout.archived_equals(BRIDGE / "ratelimit-bridge-oci.tar")


def test_the_same_binary_gives_the_same_digests(tmp_path):
    from tools import oci

    layout = Layout(LAYOUT)
    (_, binary), (_, ca) = (files(layout)[entrypoint(layout).lstrip("/")],
                            files(layout)["etc/ssl/certs/ca-certificates.crt"])
    again = [oci.write(oci.bridge_image(binary, ca, version()), tmp_path / f"layout{i}",
                       tmp_path / f"image{i}.tar", version()) for i in range(2)]
    assert again == [layout.descriptor["digest"]] * 2
    assert (tmp_path / "image0.tar").read_bytes() == (tmp_path / "image1.tar").read_bytes()


def test_the_rendered_deployment_pins_the_image_and_runs_it_locked_down():
    def docs(path):
        return [d for d in yaml.safe_load_all(path.read_text()) if d]

    def deployment(documents):
        (found,) = [d for d in documents if d["kind"] == "Deployment"]
        return found

    template = docs(ROOT / "deploy" / "istio" / "bridge.yaml")
    rendered = docs(DIST / "istio" / "bridge.yaml")
    (container,) = deployment(rendered)["spec"]["template"]["spec"]["containers"]
    digest = Layout(LAYOUT).descriptor["digest"]
    assert container["image"] == f"registry.example.com/ratelimit-bridge:{version()}@{digest}"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # Nothing else differs from deploy/istio/bridge.yaml.
    (original,) = deployment(template)["spec"]["template"]["spec"]["containers"]
    container["image"] = original["image"]
    assert rendered == template


def test_the_image_runs_with_nothing_but_its_own_files(tmp_path):
    layout = Layout(LAYOUT)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    for member, data in layout.members():  # the layers, applied in order
        target = rootfs / member.name
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.issym():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(member.linkname)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(stat.S_IMODE(member.mode))
    # What the kubelet mounts into every container.
    (rootfs / "etc" / "hosts").write_text("127.0.0.1 localhost valkey.test\n")
    valkey_port, bridge_port = free_port(), free_port()
    valkey = subprocess.Popen(
        [VALKEY, "--port", str(valkey_port), "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, cwd=tmp_path)
    env = dict(e.split("=", 1) for e in layout.config["config"]["Env"])
    # Started by the path Envoy Gateway runs envoyproxy/ratelimit's image by, which leads
    # to the entrypoint.
    argv = [shutil.which("unshare"), "-r", shutil.which("chroot"), str(rootfs), "/bin/ratelimit",
            f"--redis=redis://valkey.test:{valkey_port}", f"--listen=127.0.0.1:{bridge_port}"]
    log = tmp_path / "bridge.log"
    bridge = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for("the bridge in its image",
                 lambda: request(bridge_port, "/healthz", timeout=1)[0] == 200,
                 timeout=30, proc=bridge, log=log)
        answers = [request(bridge_port, "/v1/check", {"content-type": "text/plain"},
                           method="POST", body=b"rl:image,1,1,60000,1\n")[2]
                   for _ in range(2)]
        # One token: the first check takes it, the second is refused.
        assert [a.split(" ")[1].split(",")[0] for a in answers] == ["1", "0"], answers
        status, _, metrics = request(bridge_port, "/metrics")
        assert status == 200 and "checks_total" in metrics
    finally:
        for proc in (bridge, valkey):
            proc.send_signal(signal.SIGTERM)
        for proc in (bridge, valkey):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(rootfs, ignore_errors=True)
