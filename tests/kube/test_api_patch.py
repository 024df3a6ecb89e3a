"""What the facade's requests put on the wire, which the API-server emulator does not check: the
client's credentials (a refreshed token included) and headers, the patch types, the quoted paths,
the query strings of lists and watches, the POSTed JSON; and what it makes of error answers. An
HTTP server on a real socket records each request and answers with a canned reply."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes
import pytest

from deviceplugin.kube.api import JSON_PATCH, MERGE_PATCH, ApiError, Kube


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # by lower-case name
    body: bytes


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[Seen] = []
        self.answer: tuple[int, str, bytes] = (200, "application/json", b'{"kind": "Node"}')


class Handler(BaseHTTPRequestHandler):
    server: Recorder
    protocol_version = "HTTP/1.1"  # keep-alive, as an API server answers

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(
            Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        status, content_type, answer = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_PATCH = do_POST = _record

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def kube(recorder: Recorder) -> Kube:
    """A client with a bearer token that its refresh hook renews before every request."""
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{recorder.server_address[1]}"
    configuration.api_key = {"authorization": "token-0"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    renewed = iter(range(1, 1000))

    def refresh(config: kubernetes.client.Configuration) -> None:
        config.api_key = {"authorization": f"token-{next(renewed)}"}

    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed as always None
    configuration.retries = False
    return Kube(kubernetes.client.ApiClient(configuration))


def test_a_patch_carries_the_credentials_and_headers_of_the_clients_other_calls(
    recorder: Recorder, kube: Kube
) -> None:
    kube.get_node("n")
    kube.patch_node("n", {"metadata": {"labels": {"a": "1"}}})
    kube.patch_node("n", {"metadata": {"labels": {"a": "2"}}})
    read, first, second = recorder.seen
    assert first.headers["authorization"] == "Bearer token-2"  # renewed for each call
    assert second.headers["authorization"] == "Bearer token-3"
    assert read.headers["authorization"] == "Bearer token-1"
    assert first.headers["user-agent"] == read.headers["user-agent"]
    assert first.headers["accept"] == "application/json"


def test_each_patch_goes_out_as_its_type_to_its_quoted_path(recorder: Recorder, kube: Kube) -> None:
    kube.patch_pod_annotations("ml", "p/x", {"a": "1", "b": None}, resource_version="7")
    kube.patch_node("n", {"metadata": {"annotations": {"a": "1"}}})
    kube.patch_node_status("n", {"status": {"capacity": {"gpu": "2"}}})
    assert kube.remove_node_annotation("n", "volcano.sh/lock")
    pod, node, status, removal = recorder.seen
    assert (pod.method, pod.path, pod.headers["content-type"]) == (
        "PATCH",
        "/api/v1/namespaces/ml/pods/p%2Fx",
        MERGE_PATCH,
    )
    assert json.loads(pod.body) == {
        "metadata": {"annotations": {"a": "1", "b": None}, "resourceVersion": "7"}
    }
    assert (node.path, node.headers["content-type"]) == ("/api/v1/nodes/n", MERGE_PATCH)
    assert (status.path, json.loads(status.body)) == (
        "/api/v1/nodes/n/status",
        {"status": {"capacity": {"gpu": "2"}}},
    )
    assert (removal.path, removal.headers["content-type"]) == ("/api/v1/nodes/n", JSON_PATCH)
    assert json.loads(removal.body) == [{"op": "remove", "path": "/metadata/annotations/volcano.sh~1lock"}]


def test_an_error_that_is_no_status_object_keeps_the_http_reason_and_body(
    recorder: Recorder, kube: Kube
) -> None:
    recorder.answer = (503, "text/plain", b"upstream connect error")
    with pytest.raises(ApiError) as caught:
        kube.patch_node("n", {"metadata": {"labels": {"a": "1"}}})
    assert (caught.value.status, caught.value.reason) == (503, "Service Unavailable")
    assert "upstream connect error" in str(caught.value) and caught.value.transient
    assert kube.errors == {("patch_node", 503): 1}


def _query(seen: Seen) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(seen.path).query, keep_blank_values=True))


def test_lists_and_watches_send_their_selector_and_version_as_query_parameters(
    recorder: Recorder, kube: Kube
) -> None:
    recorder.answer = (
        200,
        "application/json",
        b'{"items": [{"kind": "Pod"}], "metadata": {"resourceVersion": "9"}}',
    )
    assert kube.list_pods("spec.nodeName=a b,status.phase!=Failed") == ([{"kind": "Pod"}], "9")
    assert kube.list_nodes_versioned() == ([{"kind": "Pod"}], "9")
    recorder.answer = (200, "application/json", b'{"type": "ADDED", "object": {"kind": "Pod"}}\n')
    with kube.watch_pods("spec.nodeName=a", "12", 30) as stream:
        assert list(stream) == [{"type": "ADDED", "object": {"kind": "Pod"}}]
    with kube.watch_nodes("", "", 5) as stream:
        list(stream)
    pods, nodes, watch, node_watch = recorder.seen
    assert urllib.parse.urlsplit(pods.path).path == "/api/v1/pods"
    assert _query(pods) == {"fieldSelector": "spec.nodeName=a b,status.phase!=Failed"}
    assert nodes.path == "/api/v1/nodes"  # no selector: no empty fieldSelector= either
    assert _query(watch) == {
        "allowWatchBookmarks": "true",
        "fieldSelector": "spec.nodeName=a",
        "resourceVersion": "12",
        "timeoutSeconds": "30",
        "watch": "true",
    }
    assert urllib.parse.urlsplit(node_watch.path).path == "/api/v1/nodes"
    assert _query(node_watch) == {
        "allowWatchBookmarks": "true",
        "resourceVersion": "",
        "timeoutSeconds": "5",
        "watch": "true",
    }
    assert all(
        seen.method == "GET" and seen.headers["accept"] == "application/json" for seen in recorder.seen
    )


def test_reads_and_posts_go_to_quoted_paths_with_credentials_and_a_json_body(
    recorder: Recorder, kube: Kube
) -> None:
    assert kube.get_pod("ml", "p x") == {"kind": "Node"}
    kube.bind_pod("ml", "p/x", "node-a", {"a": "1"}, uid="u-1")
    kube.create_event("ml", {"kind": "Event", "message": "m"})
    read, binding, event = recorder.seen
    assert (read.method, read.path) == ("GET", "/api/v1/namespaces/ml/pods/p%20x")
    assert (binding.method, binding.path) == ("POST", "/api/v1/namespaces/ml/pods/p%2Fx/binding")
    assert json.loads(binding.body) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p/x", "namespace": "ml", "annotations": {"a": "1"}, "uid": "u-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    assert (event.method, event.path, json.loads(event.body)) == (
        "POST",
        "/api/v1/namespaces/ml/events",
        {"kind": "Event", "message": "m"},
    )
    assert [seen.headers["authorization"] for seen in recorder.seen] == [
        "Bearer token-1",
        "Bearer token-2",
        "Bearer token-3",
    ]
    assert binding.headers["content-type"] == event.headers["content-type"] == "application/json"


def test_every_kind_of_call_reads_an_error_answer_and_counts_it_by_call(
    recorder: Recorder, kube: Kube
) -> None:
    recorder.answer = (
        404,
        "application/json",
        b'{"kind": "Status", "reason": "NotFound", "message": "gone"}',
    )
    with pytest.raises(ApiError) as missing:
        kube.get_node("n")
    assert (missing.value.status, missing.value.reason, str(missing.value)) == (
        404,
        "NotFound",
        "404 NotFound: gone",
    )
    recorder.answer = (502, "text/html", b"<html>bad gateway</html>")
    calls: dict[str, Callable[[], object]] = {
        "list_pod_for_all_namespaces": lambda: kube.list_pods("a=b"),
        "watch_pods": lambda: kube.watch_pods("", "1", 5),
        "create_namespaced_event": lambda: kube.create_event("ml", {"kind": "Event"}),
    }
    for call in calls.values():
        with pytest.raises(ApiError) as caught:
            call()
        assert (caught.value.status, caught.value.reason) == (502, "Bad Gateway")
        assert "<html>bad gateway</html>" in str(caught.value) and caught.value.transient
    assert kube.errors == {("read_node", 404): 1, **{(name, 502): 1 for name in calls}}
