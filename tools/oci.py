"""OCI images written without docker: Istio's Wasm image of dist/ratelimit.wasm, and the
bridge's container image.

- **The Wasm image.** Istio fetches a WasmPlugin's `oci://` url with go-containerregistry
  and, for an OCI image manifest, reads the *compat* variant: the manifest's last layer
  must be `application/vnd.oci.image.layer.v1.tar+gzip`, and the file called `plugin.wasm`
  in that tar is the module (istio/istio, pkg/wasm/imagefetcher.go).
- **The bridge's image.** What a kubelet's runtime (containerd, CRI-O) runs: a config
  naming the platform (linux/amd64), the entrypoint and a non-root user, and one layer
  holding the static binary and the CA roots `rediss://` trusts by default (nothing else:
  no shell, no package manager, no C library).

Each is written as an OCI image layout (a directory: `oci-layout`, `index.json`,
`blobs/sha256/<digest>`) and the same layout as one tar (an "oci-archive"), which
`oras cp --from-oci-layout`, `crane push` and `skopeo copy --preserve-digests
oci-archive:...` push to a registry unchanged.

The standard library suffices; no registry client on PyPI writes a layout (oras-py only
talks to registries) and docker, buildah or skopeo would need root to install here. The
output is reproducible: fixed mtimes, owners, modes and gzip header, so the same inputs
always give the same digests, and a digest a manifest pins does not change with a rebuild.
`make package` (tools/package.py) calls `write`.
"""

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
WASM_NAME = "plugin.wasm"
# Where the bridge's image keeps its files, and who runs it: the uid distroless images
# call `nonroot`, owning nothing in the image (every file is root's and read-only to it).
BRIDGE_PATH = "usr/local/bin/ratelimit-bridge"
RATELIMIT_PATH = "bin/ratelimit"
CA_PATH = "etc/ssl/certs/ca-certificates.crt"
BRIDGE_USER = "65532:65532"


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(document):
    """JSON with one spelling, so that its digest depends on its content only."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def tar_of(files):
    """A reproducible tar of `files`: name -> bytes, or (bytes, mode), or a str: a symbolic
    link to that path; a name ending in / is a directory. Every entry is root's, dated
    1970."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            data, mode = data if isinstance(data, tuple) else (data, 0o644)
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, data, 0o777
                tar.addfile(info)
            else:
                info.mode, info.size = mode, len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def directories(path):
    """The directory entries a tar needs before `path`: `a/`, `a/b/` for `a/b/c`."""
    parts = path.split("/")[:-1]
    return {"/".join(parts[:i + 1]) + "/": b"" for i in range(len(parts))}


def image(files, platform, runtime=None, title=None):
    """The blobs of a one-layer image of `files` (digest -> bytes), its manifest's digest
    and size. `platform` is (architecture, os); `runtime` the config's `config` (entrypoint,
    user, ...)."""
    layer_tar = tar_of(files)
    layer = gzip.compress(layer_tar, compresslevel=9, mtime=0)
    architecture, os = platform
    config = canonical({
        "architecture": architecture,
        "os": os,
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer_tar)]},
        "config": runtime or {},
    })
    descriptor = {"mediaType": LAYER, "digest": sha256(layer), "size": len(layer)}
    if title:
        descriptor["annotations"] = {"org.opencontainers.image.title": title}
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": sha256(config), "size": len(config)},
        "layers": [descriptor],
    })
    blobs = {sha256(blob): blob for blob in (layer, config, manifest)}
    return blobs, sha256(manifest), len(manifest)


def wasm_image(wasm):
    """Istio's image of a Wasm module."""
    # GOOS/GOARCH names of WebAssembly with WASI preview 1; nothing runs the image.
    return image({WASM_NAME: wasm}, ("wasm", "wasip1"), title=WASM_NAME)


def bridge_image(binary, ca_bundle, version):
    """The bridge's container image: its static linux/amd64 `binary` and `ca_bundle`."""
    files = {**directories(BRIDGE_PATH), BRIDGE_PATH: (binary, 0o755),
             **directories(CA_PATH), CA_PATH: ca_bundle,
             # Where envoyproxy/ratelimit's image has its binary, which Envoy Gateway's
             # Deployment runs by path (`/bin/ratelimit`): the image swapped in runs the
             # bridge, reading that service's environment (docs/rate-limit-service.md).
             **directories(RATELIMIT_PATH), RATELIMIT_PATH: "/" + BRIDGE_PATH}
    runtime = {
        "Entrypoint": ["/" + BRIDGE_PATH],
        "User": BRIDGE_USER,
        # In a container the loopback address the bridge listens on by default reaches
        # nobody; --listen still overrides it.
        "Env": ["RATELIMIT_BRIDGE_LISTEN=0.0.0.0:8081"],
        "ExposedPorts": {"8081/tcp": {}},
        "Labels": {"org.opencontainers.image.title": "ratelimit-bridge",
                   "org.opencontainers.image.version": version},
    }
    return image(files, ("amd64", "linux"), runtime)


def write(built, layout, archive, tag):
    """Writes the layout directory of image `built` (what `image` returns) and its tar;
    returns the manifest's digest."""
    blobs, digest, size = built
    index = canonical({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{"mediaType": MANIFEST, "digest": digest, "size": size,
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    })
    files = {"oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), "index.json": index,
             "blobs/": b"", "blobs/sha256/": b""}
    files.update((f"blobs/sha256/{d.removeprefix('sha256:')}", b) for d, b in sorted(blobs.items()))
    shutil.rmtree(layout, ignore_errors=True)
    Path(layout).mkdir(parents=True)
    for name, data in files.items():
        path = Path(layout) / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.write_bytes(data)
    Path(archive).write_bytes(tar_of(files))
    return digest
