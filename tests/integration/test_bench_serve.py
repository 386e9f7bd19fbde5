"""`tachyon bench serve` / `sweep` against a fake OpenAI-compatible server that streams at known times,
against bad servers and files, and (when the server package exists) against a live `tachyon serve`."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from tachyon.cli import main
from tests.integration.conftest import _wait_healthy

TTFT_S = 0.25  # the fake server's delay before the first token
ITL_S = 0.05  # ... and between tokens


class FakeServer:
    """A raw-asyncio HTTP server: GET /v1/models, POST /v1/completions (SSE, one token a chunk)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.loop = asyncio.new_event_loop()
        self.port = None
        self.bodies = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for h in lines[1:]:
                if h.lower().startswith("content-length:"):
                    length = int(h.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else None
            if method == "GET" and path == "/v1/models":
                data = json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
            elif self.mode == "error":
                data = b'{"error": {"message": "the fake server always fails", "code": 500}}'
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
            else:
                self.bodies.append(body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                await writer.drain()
                n = body["max_tokens"]
                for i in range(n):
                    await asyncio.sleep(TTFT_S if i == 0 else ITL_S)
                    chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    await writer.drain()
                usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
                writer.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            await writer.drain()
        finally:
            writer.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def fake():
    s = FakeServer()
    yield s
    s.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_against_fake_server_timings(fake, tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--base-url", fake.url, "--num-prompts", "4", "--input-len", "8",
               "--output-len", "5", "--vocab-size", "5000", "--max-concurrency", "2", "--num-warmups", "1",
               "--percentiles", "50,99", "--goodput", "ttft:5000", "e2el:10000", "--output", str(out),
               "--no-progress"])
    assert rc == 0
    m = json.loads(out.read_text())["runs"][0]["metrics"]
    assert m["completed"] == 4 and m["failed"] == 0 and m["total_output_tokens"] == 20
    assert m["total_input_tokens"] == 32
    # The fake streams first after 250 ms, then every 50 ms; loose bounds absorb a loaded machine.
    assert 240 <= m["median_ttft_ms"] <= 450
    assert 45 <= m["median_itl_ms"] <= 120
    assert 45 <= m["mean_tpot_ms"] <= 120
    assert 430 <= m["median_e2el_ms"] <= 800
    assert m["request_goodput"] == pytest.approx(m["request_throughput"])
    assert m["max_concurrent_requests"] <= 2
    body = fake.bodies[-1]
    assert body["model"] == "fake-model" and body["stream"] and body["ignore_eos"] and body["temperature"] == 0
    assert len(body["prompt"]) == 8 and all(1000 <= t < 4000 for t in body["prompt"])
    assert len(fake.bodies) == 5  # 1 warm-up + 4
    assert (tmp_path / "serve.md").exists()
    assert "Median TTFT (ms)" in capsys.readouterr().out


def test_sweep_against_fake_server_writes_png(fake, tmp_path):
    out = tmp_path / "sweep.json"
    rc = main(["bench", "sweep", "--base-url", fake.url, "--concurrency", "1,2", "--input-len", "4",
               "--output-len", "3", "--vocab-size", "5000", "--num-warmups", "0", "--output", str(out),
               "--no-progress", "--label", "fake"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [r["concurrency"] for r in res["runs"]] == [1, 2]
    assert [r["metrics"]["completed"] for r in res["runs"]] == [1, 2]
    png = tmp_path / "sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc = main(["bench", "--compare", str(out), str(out), "--plot-out", str(tmp_path / "cmp.png")])
    assert rc == 0 and (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"


def test_server_that_answers_errors(tmp_path, capsys):
    s = FakeServer(mode="error")
    try:
        out = tmp_path / "err.json"
        rc = main(["bench", "serve", "--base-url", s.url, "--num-prompts", "3", "--input-len", "4",
                   "--output-len", "2", "--vocab-size", "5000", "--output", str(out), "--no-progress"])
    finally:
        s.stop()
    assert rc == 1
    m = json.loads(out.read_text())["runs"][0]["metrics"]
    assert m["completed"] == 0 and m["failed"] == 3
    err = capsys.readouterr().err
    assert "3 request(s) failed" in err and "HTTP 500" in err and "Traceback" not in err


def test_unreachable_url(tmp_path, capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    rc = main(["bench", "serve", "--base-url", url, "--num-prompts", "2", "--vocab-size", "5000",
               "--output", str(tmp_path / "x.json"), "--no-progress"])
    assert rc != 0
    err = capsys.readouterr().err
    assert f"cannot reach {url}" in err and "Traceback" not in err


def test_bad_workload_file(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "hi", "output_len": 2}\nnot json\n')
    rc = main(["bench", "serve", "--base-url", "http://127.0.0.1:1", "--dataset", str(p), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2: not valid JSON" in err and "Traceback" not in err


def _server_available() -> bool:
    try:
        import tachyon.server.app  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _server_available(), reason="tachyon.server.app is not importable yet")
def test_bench_serve_against_live_tachyon_serve(tmp_path):

    port = _free_port()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "tachyon.cli", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        try:
            _wait_healthy(f"http://127.0.0.1:{port}", 180, proc)
        except RuntimeError:
            pytest.fail("tachyon serve exited: " + proc.stdout.read().decode(errors="replace")[-2000:])
        out = tmp_path / "live.json"
        r = subprocess.run([sys.executable, "-m", "tachyon.cli", "bench", "serve", "--base-url",
                            f"http://127.0.0.1:{port}", "--num-prompts", "8", "--input-len", "32",
                            "--output-len", "8", "--output", str(out), "--no-progress"],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        m = json.loads(out.read_text())["runs"][0]["metrics"]
        assert m["completed"] == 8 and m["failed"] == 0
        assert m["total_output_tokens"] == 64
        assert m["mean_ttft_ms"] > 0 and m["mean_tpot_ms"] > 0
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
