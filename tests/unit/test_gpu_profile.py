"""The KV pool's share of the GPU (gpu_profile.kv_budget_bytes): the weights are counted once."""

from tachyon.worker.gpu_profile import kv_budget_bytes

GiB = 1 << 30


def test_weights_count_once_and_the_graph_pool_holds_only_activations():
    # 70B AWQ on a 140 GiB card: 36 GiB resident, the profile step peaks at 43 GiB with a 1 GiB scratch cache
    args = dict(total=140 * GiB, utilization=0.9, non_torch=GiB, resident=36 * GiB, peak=43 * GiB, scratch=GiB)
    eager = kv_budget_bytes(**args, graph_pool=False)
    assert eager == int(126 * GiB - GiB - 36 * GiB - 6 * GiB - (256 << 20))
    # the piecewise graphs' pool takes the step's 6 GiB of activations again, not the weights
    assert kv_budget_bytes(**args, graph_pool=True) == eager - 6 * GiB
    assert kv_budget_bytes(**args, graph_pool=True, spec_bytes=GiB) == eager - 7 * GiB


def test_a_peak_under_the_resident_bytes_is_no_negative_activation():
    b = kv_budget_bytes(total=80 * GiB, utilization=1.0, non_torch=0, resident=10 * GiB, peak=9 * GiB, scratch=0,
                        graph_pool=True)
    assert b == 70 * GiB - (256 << 20)

