"""A local stand-in for the Hugging Face Hub: the part of its HTTP API that `huggingface_hub`
uses to create a repo, make a branch and push one commit of regular and LFS files.

It keeps repos, branches and file bytes in memory (tests assert exactly what arrived), records
every request (method, path, headers), answers like the real Hub where huggingface_hub looks at
the answer (401 with "Invalid credentials", 409 for a repo that exists, 404 with X-Error-Code
RepoNotFound / RevisionNotFound), and can be told to fail the next matching request.

Routes (huggingface_hub 2.x, with xet disabled so large files take the LFS "basic" transfer):

    POST /api/repos/create                              create_repo
    GET  /api/models/{repo}[/revision/{rev}]            repo_info (create_repo's exist_ok, no-op commits)
    POST /api/models/{repo}/branch/{branch}             create_branch
    POST /api/validate-yaml                             create_commit checks README.md's front matter
    POST /api/models/{repo}/preupload/{rev}             regular or LFS, per file
    POST /{repo}.git/info/lfs/objects/batch             LFS batch: where to PUT each object
    PUT  /lfs-upload/{oid}                              the object store (a presigned URL: no token)
    POST /{repo}.git/info/lfs/objects/verify            LFS verify
    POST /api/models/{repo}/commit/{rev}                the commit, as ndjson
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

# File names the Hub's default .gitattributes stores in LFS; anything >= 10 MB or binary is LFS too.
LFS_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".gguf",
    ".model",
    ".npy",
    ".npz",
    ".pkl",
    ".zip",
    ".gz",
    ".tar",
)
LFS_MIN_SIZE = 10 * 1024 * 1024
BAD_TOKEN = "Invalid credentials in Authorization header"  # the real Hub's X-Error-Message


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


@dataclass
class Commit:
    oid: str
    branch: str
    summary: str
    description: str
    paths: list[str]


@dataclass
class Repo:
    id: str
    owner: str
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)  # branch -> path -> bytes
    heads: dict[str, str] = field(default_factory=dict)  # branch -> commit oid
    commits: list[Commit] = field(default_factory=list)

    def files(self, branch: str = "main") -> dict[str, bytes]:
        return self.branches[branch]


@dataclass
class Failure:
    status: int
    matching: str
    message: str


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **body: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body


def git_blob_oid(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for a regular file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    """`with HubServer({"hf_token": "alice"}) as hub:` then `HfApi(endpoint=hub.url, token=...)`."""

    def __init__(self, tokens: dict[str, str] | None = None, orgs: dict[str, set[str]] | None = None) -> None:
        self.tokens = dict(tokens or {"hf_test_token": "alice"})  # token -> user name
        self.orgs = dict(orgs or {})  # org -> its members
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # sha256 -> bytes: the object store
        self.requests: list[Recorded] = []
        self._failures: list[Failure] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll keeps shutdown() quick (it waits for serve_forever to look).
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_next(self, status: int, matching: str = "", message: str = "injected failure") -> None:
        """Answer the next request whose path contains `matching` with `status` (once)."""
        with self._lock:
            self._failures.append(Failure(status, matching, message))

    def add_repo(self, repo_id: str, owner: str, *, private: bool = False) -> Repo:
        """A repo as the Hub creates it: branch main with an initial commit (.gitattributes)."""
        repo = Repo(repo_id, owner, private)
        repo.branches["main"] = {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}
        repo.heads["main"] = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = repo
        return repo

    def paths(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]

    # -- dispatch --------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(Recorded(method, path, headers))
            failure = next((f for f in self._failures if f.matching in path), None)
            if failure is not None:
                self._failures.remove(failure)
                raise HubError(failure.status, failure.message)
            if method == "PUT" and path.startswith("/lfs-upload/"):
                return self._lfs_put(path.removeprefix("/lfs-upload/"), body)  # presigned: no token
            if path.startswith("/api/validate-yaml"):
                return self._validate_yaml(json.loads(body))
            user = self._user(headers)
            return self._route(method, path, user, body)

    def _route(self, method: str, path: str, user: str, body: bytes) -> tuple[int, dict[str, Any]]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "POST" and path == "/api/repos/create":
            return self._create(user, json.loads(body))
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self._repo(f"{parts[2]}/{parts[3]}", user)
            rest = parts[4:]
            if method == "GET" and (not rest or (len(rest) == 2 and rest[0] == "revision")):
                return self._info(repo, rest[1] if rest else "main")
            if method == "POST" and len(rest) == 2 and rest[0] == "branch":
                return self._branch(repo, user, rest[1])
            if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                return self._preupload(repo, user, rest[1], json.loads(body))
            if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                return self._commit(repo, user, rest[1], body)
        if (
            method == "POST"
            and len(parts) == 6
            and parts[1].endswith(".git")
            and parts[2:4] == ["info", "lfs"]
        ):
            repo = self._repo(f"{parts[0]}/{parts[1].removesuffix('.git')}", user)
            self._may_write(repo.owner, user)
            if parts[4:] == ["objects", "batch"]:
                return self._lfs_batch(repo, json.loads(body))
            if parts[4:] == ["objects", "verify"]:
                return self._lfs_verify(json.loads(body))
        raise HubError(404, f"no route for {method} {path}")

    # -- auth ------------------------------------------------------------------------------

    def _user(self, headers: dict[str, str]) -> str:
        auth = headers.get("authorization", "")
        user = self.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        if user is None:
            raise HubError(401, BAD_TOKEN)
        return user

    def _may_write(self, namespace: str, user: str) -> None:
        if namespace != user and user not in self.orgs.get(namespace, set()):
            raise HubError(403, f'You don\'t have the rights to write to the namespace "{namespace}"')

    def _repo(self, repo_id: str, user: str) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (
            repo.private and repo.owner != user and user not in self.orgs.get(repo.owner, ())
        ):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    # -- repos and branches ----------------------------------------------------------------

    def _create(self, user: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        namespace = payload.get("organization") or user
        repo_id = f"{namespace}/{payload['name']}"
        self._may_write(namespace, user)
        if repo_id in self.repos:
            # The real Hub's 409 carries the url: create_repo(exist_ok=True) returns it.
            raise HubError(409, "You already created this model repo", url=f"{self.url}/{repo_id}")
        self.add_repo(repo_id, namespace, private=payload.get("visibility") == "private")
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

    def _info(self, repo: Repo, revision: str) -> tuple[int, dict[str, Any]]:
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        files = [{"rfilename": p} for p in sorted(repo.branches[revision])]
        return 200, {"id": repo.id, "sha": repo.heads[revision], "private": repo.private, "siblings": files}

    def _branch(self, repo: Repo, user: str, branch: str) -> tuple[int, dict[str, Any]]:
        self._may_write(repo.owner, user)
        if branch in repo.branches:
            raise HubError(409, f"Reference already exists: refs/heads/{branch}")
        repo.branches[branch] = dict(repo.branches["main"])
        repo.heads[branch] = repo.heads["main"]
        return 200, {}

    # -- a commit --------------------------------------------------------------------------

    def _validate_yaml(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        content: str = payload.get("content", "")
        if not content.startswith("---\n"):
            return 200, {"warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            meta = yaml.safe_load(content.split("---\n", 2)[1])
        except (IndexError, yaml.YAMLError) as exc:
            return 400, {"errors": [{"message": f"invalid YAML: {exc}"}]}
        if not isinstance(meta, dict):
            return 400, {"errors": [{"message": "metadata must be a mapping"}]}
        return 200, {}

    def _preupload(
        self, repo: Repo, user: str, revision: str, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        self._may_write(repo.owner, user)
        files = self._branch_files(repo, revision)
        out = []
        for item in payload["files"]:
            sample = base64.b64decode(item["sample"])
            lfs = item["path"].endswith(LFS_SUFFIXES) or item["size"] >= LFS_MIN_SIZE or b"\0" in sample
            entry: dict[str, Any] = {
                "path": item["path"],
                "uploadMode": "lfs" if lfs else "regular",
                "shouldIgnore": False,
            }
            existing = files.get(item["path"])
            if existing is not None:  # lets huggingface_hub skip a file that has not changed
                entry["oid"] = hashlib.sha256(existing).hexdigest() if lfs else git_blob_oid(existing)
            out.append(entry)
        return 200, {"files": out, "commitOid": repo.heads[revision]}

    def _lfs_batch(self, repo: Repo, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise HubError(422, "only basic uploads are served here")
        objects = []
        for obj in payload["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if self.lfs.get(obj["oid"]) is None:  # absent: tell the client where to PUT it
                entry["actions"] = {
                    "upload": {"href": f"{self.url}/lfs-upload/{obj['oid']}"},
                    "verify": {"href": f"{self.url}/{repo.id}.git/info/lfs/objects/verify"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def _lfs_put(self, oid: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"content does not match oid {oid}")
        self.lfs[oid] = body
        return 200, {}

    def _lfs_verify(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = self.lfs.get(payload["oid"])
        if data is None or len(data) != payload["size"]:
            raise HubError(404, f"object {payload['oid']} was not uploaded")
        return 200, {}

    def _commit(self, repo: Repo, user: str, revision: str, body: bytes) -> tuple[int, dict[str, Any]]:
        self._may_write(repo.owner, user)
        files = dict(self._branch_files(repo, revision))
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        paths = []
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.lfs:
                    raise HubError(422, f"LFS object of {value['path']} was never uploaded")
                files[value["path"]] = self.lfs[value["oid"]]
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key != "header":
                raise HubError(400, f"unsupported commit operation {key!r}")
            if key != "header":
                paths.append(value["path"])
        oid = hashlib.sha1(repo.heads[revision].encode() + json.dumps(lines).encode()).hexdigest()
        repo.branches[revision], repo.heads[revision] = files, oid
        repo.commits.append(Commit(oid, revision, header["summary"], header.get("description", ""), paths))
        return 200, {
            "commitUrl": f"{self.url}/{repo.id}/commit/{oid}",
            "commitOid": oid,
            "pullRequestUrl": None,
            "success": True,
        }

    @staticmethod
    def _branch_files(repo: Repo, revision: str) -> dict[str, bytes]:
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.branches[revision]

    # -- http ------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def do_PUT(self) -> None:
                self._serve()

            def _serve(self) -> None:
                body = self._body()
                path = urlsplit(self.path).path
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    status, payload = hub.handle(self.command, path, headers, body)
                    extra: dict[str, str] = {}
                except HubError as exc:
                    status, payload = exc.status, {"error": exc.message, **exc.body}
                    extra = {"X-Error-Message": exc.message}
                    if exc.code:
                        extra["X-Error-Code"] = exc.code
                except Exception as exc:  # a bug in this server: say so instead of hanging
                    status, payload, extra = 500, {"error": f"hub_server: {exc!r}"}, {}
                self._reply(status, payload, extra)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()  # the CRLF after each chunk
                        if size == 0:
                            return b"".join(chunks)
                        chunks.append(chunk)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reply(self, status: int, payload: dict[str, Any], extra: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status, HTTPStatus(status).phrase)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `requests`
                pass

        return Handler
