"""ModelRegistry without models: which version a name reaches after load, swap (build or promote) and unload, and
that a version taken out of the tables is shut down only once its requests (and handlers) are done, or after
its drain timeout with the rest aborted. Fake engines: only the registry's own logic runs."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
from tachyon.server.errors import APIError  # noqa: E402
from tachyon.server.frontend import FrontendOptions  # noqa: E402
from tachyon.server.models import (  # noqa: E402
    LoadModelRequest,
    ModelRegistry,
    ServedModel,
    SwapModelRequest,
    UnloadModelRequest,
)


class FakeEngine:
    def __init__(self):
        self.requests: list[str] = []
        self.shut_down = False
        self.process = None

    def request_ids(self):
        return list(self.requests)


class FakeAsyncEngine:
    def __init__(self):
        self.engine = FakeEngine()

    def start(self):
        pass

    def wake(self):
        pass

    def shutdown(self):
        self.engine.shut_down = True


class FakeServing:
    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.draining = False

    def abort_all(self):
        self.engine.requests.clear()


def registry() -> ModelRegistry:
    def make(engine, options, names, version, root):
        return ServedModel(names, version, root, engine, FakeServing(engine.engine), metrics=None)

    reg = ModelRegistry(make, lambda model: (FakeAsyncEngine(), FrontendOptions()), lambda m: [m])
    reg.add(make(FakeAsyncEngine(), None, ["tiny"], "v1", "/a"))
    return reg


def test_canary_then_promote_then_unload_falls_back():
    async def run():
        reg = registry()
        v1 = reg.resolve("tiny")
        await reg.load(LoadModelRequest(model="/b", served_model_name="tiny", version="v2"))
        v2 = reg.resolve("tiny@v2")
        assert reg.resolve("tiny") is v1 and reg.resolve(None) is v1 and v2 is not v1
        assert reg.names() == ["tiny", "tiny@v1", "tiny@v2"]
        await reg.load(LoadModelRequest(model="/c", version="v3"))  # a new name: "/c", its own default
        assert reg.resolve("/c") is reg.resolve("/c@v3")
        v1.async_engine.engine.requests.append("r1")  # a request still running on v1
        swap = asyncio.ensure_future(reg.swap(SwapModelRequest(served_model_name="tiny", version="v2")))
        await asyncio.sleep(0.1)
        assert reg.resolve("tiny") is v2 and not swap.done() and not v1.async_engine.engine.shut_down
        with pytest.raises(APIError) as e:
            reg.resolve("tiny@v1")
        assert e.value.status == 404
        v1.async_engine.engine.requests.clear()  # it finishes: v1 shuts down, the swap answers
        body = await asyncio.wait_for(swap, 1)
        assert body["swapped"] == {"from": ["tiny@v1"], "to": "tiny@v2"}
        assert (body["in_flight"], body["aborted"]) == (1, 0) and v1.async_engine.engine.shut_down
        with pytest.raises(APIError) as e:  # v2 is already the default: nothing to swap out
            await reg.swap(SwapModelRequest(served_model_name="tiny", version="v2"))
        assert e.value.status == 409
        await reg.load(LoadModelRequest(model="/d", served_model_name="tiny", version="v4"))
        assert reg.resolve("tiny") is v2  # a loaded version is a canary until swapped in
        assert await reg.unload(UnloadModelRequest(model="tiny")) == {"unloaded": "tiny@v2", "in_flight": 0,
                                                                       "aborted": 0}
        assert reg.resolve("tiny") is reg.resolve("tiny@v4")  # the newest other version is the default now
        return reg

    reg = asyncio.run(run())
    assert reg.retiring == []


def test_a_handler_holds_its_model_and_the_drain_timeout_aborts():
    async def run():
        reg = registry()
        v1 = reg.resolve("tiny")
        with reg.use("tiny"):  # a handler picked v1 and has not started its engine request yet
            unload = asyncio.ensure_future(reg.unload(UnloadModelRequest(model="tiny@v1", drain_timeout_s=5)))
            await asyncio.sleep(0.1)
            assert not unload.done() and reg.names() == []
        assert await asyncio.wait_for(unload, 1) == {"unloaded": "tiny@v1", "in_flight": 0, "aborted": 0}
        await reg.load(LoadModelRequest(model="/b", served_model_name="tiny", version="v2"))
        v2 = reg.resolve("tiny")
        v2.async_engine.engine.requests.append("stuck")
        body = await reg.unload(UnloadModelRequest(model="tiny@v2", drain_timeout_s=0.05))
        assert body == {"unloaded": "tiny@v2", "in_flight": 1, "aborted": 1}
        assert v1.async_engine.engine.shut_down and v2.async_engine.engine.shut_down
        with pytest.raises(APIError) as e:
            reg.resolve(None)
        assert e.value.message == "the model None does not exist; this server serves none (POST " \
                                  "/admin/models/load loads one)"

    asyncio.run(run())
