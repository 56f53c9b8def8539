"""Artifact sources: where a profile says a model's weights come from, parsed and validated.

Pure and shared: the admin API refuses a profile whose source this does not accept, and the
agent parses the same source again before it fetches anything (grid.agent.artifacts).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import msgspec

_HF_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Source(msgspec.Struct, frozen=True, kw_only=True):
    scheme: str
    # file: absolute path; http(s): the URL; hf: owner/repo/revision/path
    location: str
    owner: str = ""
    repo: str = ""
    revision: str = ""
    path: str = ""

    def http_url(self) -> str:
        if self.scheme in ("http", "https"):
            return self.location
        if self.scheme == "hf":
            return f"https://huggingface.co/{self.owner}/{self.repo}/resolve/{self.revision}/{self.path}"
        raise ValueError(f"no URL for a {self.scheme} source")


class SourceError(ValueError):
    pass


def parse_source(source: str) -> Source:
    """Validate an operator-authorized artifact source (pure)."""
    parts = urlsplit(source)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SourceError("file:// sources must be local (file:///absolute/path)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise SourceError("file:// sources need an absolute path")
        return Source(scheme="file", location=path)
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise SourceError("http(s) source without a host")
        if parts.username or parts.password:
            raise SourceError("artifact sources must not embed credentials")
        return Source(scheme=scheme, location=source)
    if scheme == "hf":
        if parts.username or parts.password or parts.query or parts.fragment:
            raise SourceError("hf:// sources are hf://owner/repo[@revision]/path.gguf, nothing else")
        owner = parts.netloc
        rest = [p for p in unquote(parts.path).split("/") if p]
        if len(rest) < 2:
            raise SourceError("hf:// source needs owner, repo and a file path")
        repo, revision = rest[0], "main"
        if "@" in repo:
            repo, revision = repo.split("@", 1)
        file_parts = rest[1:]
        for token in (owner, repo, revision, *file_parts):
            if not _HF_TOKEN.match(token) or token in (".", ".."):
                raise SourceError(f"invalid hf:// path component {token!r}")
        path = "/".join(file_parts)
        if not path.lower().endswith(".gguf"):
            raise SourceError("hf:// source must name a .gguf file")
        return Source(scheme="hf", location=source, owner=owner, repo=repo, revision=revision, path=path)
    raise SourceError(f"unsupported artifact source scheme {parts.scheme!r}")
