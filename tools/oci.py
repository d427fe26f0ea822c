"""Istio's Wasm image for dist/ratelimit.wasm, written without docker.

Istio fetches a WasmPlugin's `oci://` url with go-containerregistry and, for an OCI image
manifest, reads the *compat* variant: the manifest's last layer must be
`application/vnd.oci.image.layer.v1.tar+gzip`, and the file called `plugin.wasm` in that
tar is the module (istio/istio, pkg/wasm/imagefetcher.go). This writes such an image as an
OCI image layout (a directory: `oci-layout`, `index.json`, `blobs/sha256/<digest>`) and the
same layout as one tar (an "oci-archive"), which `oras cp --from-oci-layout`, `crane push`
and `skopeo copy --preserve-digests oci-archive:...` push to a registry unchanged.

The standard library suffices; no registry client on PyPI writes a layout (oras-py only
talks to registries) and docker, buildah or skopeo would need root to install here. The
output is reproducible: fixed mtimes, owners, modes and gzip header, so the same wasm always
gives the same digests, and the digest a WasmPlugin pins does not change with a rebuild.
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


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(document):
    """JSON with one spelling, so that its digest depends on its content only."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def tar_of(files):
    """A reproducible tar of `files` (name -> bytes; a name ending in / is a directory)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode, info.size = 0o644, len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def image(wasm):
    """The blobs of the image (digest -> bytes) and its manifest's digest."""
    layer_tar = tar_of({WASM_NAME: wasm})
    layer = gzip.compress(layer_tar, compresslevel=9, mtime=0)
    config = canonical({
        # GOOS/GOARCH names of WebAssembly with WASI preview 1; nothing runs the image.
        "architecture": "wasm",
        "os": "wasip1",
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer_tar)]},
        "config": {},
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": sha256(config), "size": len(config)},
        "layers": [{"mediaType": LAYER, "digest": sha256(layer), "size": len(layer),
                    "annotations": {"org.opencontainers.image.title": WASM_NAME}}],
    })
    blobs = {sha256(blob): blob for blob in (layer, config, manifest)}
    return blobs, sha256(manifest), len(manifest)


def write(wasm, layout, archive, tag):
    """Writes the layout directory and its tar; returns the manifest's digest."""
    blobs, digest, size = image(wasm)
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
