"""The store's job transitions on a real Redis: claim, stale reclaim, begin, poison, finish."""

import os

from service.store import Store


def fresh_key() -> str:
    return os.urandom(32).hex()


def claim(store: Store, key: str, stale_s: float = 3600):
    return store.claim(key, "{}", team="alpha", target="cpu", options_json="{}", queue="compile.cpu",
                       stale_s=stale_s, ttl_s=600)


def test_claim_creates_one_job_and_joins_it(store):
    key = fresh_key()
    assert claim(store, key).state == "new"
    assert claim(store, key).state == "queued"
    assert store.job(key)["attempts"] == "1"
    assert store.redis.exists(store.k("graph", key))


def test_a_stale_job_is_claimed_again(store):
    """A job whose worker vanished without redelivery (e.g. the broker lost it) is not stuck forever."""
    key = fresh_key()
    assert claim(store, key).state == "new"
    again = claim(store, key, stale_s=0)
    assert again.state == "new" and again.attempt == 2


def test_superseded_and_poisoned_deliveries_do_not_compile(store):
    key = fresh_key()
    first = claim(store, key)
    assert store.begin(key, first.attempt, "w", max_deliveries=2).action == "run"
    assert store.begin(key, first.attempt, "w", max_deliveries=2).action == "run"  # a redelivery
    poisoned = store.begin(key, first.attempt, "w", max_deliveries=2)
    assert poisoned.action == "poisoned"
    job = store.job(key)
    assert job["state"] == "failed" and "worker died 2 times" in job["error"]
    assert job["compiles"] == "2"
    # resubmitting starts a fresh attempt; a late message of the old one is ignored
    second = claim(store, key)
    assert second.state == "new" and second.attempt == 2
    assert store.begin(key, first.attempt, "w", max_deliveries=2).action == "superseded"
    assert store.begin(key, second.attempt, "w", max_deliveries=2).action == "run"


def test_finish_ready_drops_the_graph_and_records_timings(store):
    key = fresh_key()
    attempt = claim(store, key).attempt
    store.begin(key, attempt, "w", 3)
    store.progress(key, "codegen", 0.5)
    assert store.job(key)["stage"] == "codegen"
    store.finish(key, "ready", 600, 1.5, digest="d", size=10)
    job = store.job(key)
    assert job["state"] == "ready" and job["compile_s"] == "1.500" and job["size"] == "10"
    assert not store.redis.exists(store.k("graph", key))
    store.progress(key, "late", 0.9)  # a finished job does not move
    assert store.job(key)["stage"] == "done"
    assert store.compile_histogram("ready")[1] >= 1


def test_rate_limit_counts_per_team_and_window(store):
    team = "rl-" + fresh_key()[:8]
    assert [store.hit_rate_limit(team, 2) for _ in range(3)][:2] == [0.0, 0.0]
    assert 1 <= store.hit_rate_limit(team, 2) <= 60
    assert store.hit_rate_limit(team + "-other", 2) == 0.0
    assert store.hit_rate_limit(team, 0) == 0.0  # 0: no limit
