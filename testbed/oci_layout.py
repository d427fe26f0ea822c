"""An OCI image layout read back the way a registry client and a container runtime read
it, independently of tools/oci.py, which writes it: every blob is found by its digest and
checked against it and against its descriptor's size on the way; a layer is a tar+gzip
whose uncompressed digest is the config's `diff_id`."""

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def digest_of(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layout:
    """The layout in directory `path`, holding one image."""

    def __init__(self, path):
        self.path = Path(path)
        marker = json.loads((self.path / "oci-layout").read_text())
        assert marker == {"imageLayoutVersion": "1.0.0"}, marker
        index = json.loads((self.path / "index.json").read_text())
        assert index["schemaVersion"] == 2, index
        (self.descriptor,) = index["manifests"]
        assert self.descriptor["mediaType"] == OCI_MANIFEST, self.descriptor
        self.manifest = json.loads(self.blob(self.descriptor))
        assert self.manifest["mediaType"] == OCI_MANIFEST != DOCKER_MANIFEST, self.manifest
        assert self.manifest["config"]["mediaType"] == OCI_CONFIG, self.manifest
        self.config = json.loads(self.blob(self.manifest["config"]))

    def blob(self, descriptor):
        """The blob a descriptor names, after checking its digest and size."""
        algorithm, _, hexdigest = descriptor["digest"].partition(":")
        assert algorithm == "sha256", descriptor
        data = (self.path / "blobs" / "sha256" / hexdigest).read_bytes()
        assert digest_of(data) == descriptor["digest"], descriptor
        assert len(data) == descriptor["size"], descriptor
        return data

    def layers(self):
        """Each layer's uncompressed tar, in order, checked against the config's diff_ids."""
        tars = []
        for layer in self.manifest["layers"]:
            assert layer["mediaType"] == OCI_LAYER, layer
            tars.append(gzip.decompress(self.blob(layer)))
        assert self.config["rootfs"] == {"type": "layers",
                                         "diff_ids": [digest_of(t) for t in tars]}
        return tars

    def members(self):
        """Every entry of every layer: (tar member, bytes or None), in order."""
        out = []
        for layer in self.layers():
            with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
                for member in tar.getmembers():
                    data = tar.extractfile(member).read() if member.isfile() else None
                    out.append((member, data))
        return out

    def referenced(self):
        """The digests the index and the manifest name."""
        return ({self.descriptor["digest"], self.manifest["config"]["digest"]}
                | {layer["digest"] for layer in self.manifest["layers"]})

    def stored(self):
        """The digests of the blobs stored, each checked against its content."""
        blobs = list((self.path / "blobs" / "sha256").iterdir())
        for blob in blobs:
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
        return {"sha256:" + blob.name for blob in blobs}

    def archived_equals(self, archive):
        """Whether the tar `archive` holds exactly this layout's files."""
        with tarfile.open(archive) as tar:
            archived = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        on_disk = {p.relative_to(self.path).as_posix(): p.read_bytes()
                   for p in self.path.rglob("*") if p.is_file()}
        return archived == on_disk
