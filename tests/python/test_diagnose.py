"""epx.Diagnose: the verdict rule (DeepEP's ratios against the others' mean) on DeepEP's
docstring matrices and on a slow rank that DeepEP's mean of all rows hides, and over real calls
on 4 ranks — a rank that is late to every dispatch (it sleeps first) is the slow source on
every rank, over a group with watch() and over an EPBuffer whose engine its first dispatch
builds; start()/stop(), the log."""
import os
import time

import numpy as np
import pytest

import epx
from epx_cases import inputs, make_case

P = 4


def test_diagnose_matrix_deepep_examples():
    base = np.array([[16, 13, 10, 17, 18, 18, 19, 12], [10, 19, 11, 18, 16, 16, 16, 13], [18, 18, 12, 10, 18, 19, 18, 15],
                     [13, 18, 16, 12, 12, 11, 18, 18], [14, 20, 10, 14, 14, 16, 18, 16], [20, 20, 15, 14, 19, 13, 15, 18],
                     [18, 17, 19, 17, 10, 17, 17, 19], [15, 17, 20, 18, 13, 13, 15, 14]], dtype=float)
    col = base.copy()
    col[:, 3] += 100
    row = base.copy()
    row[6, :] += 120
    point = base.copy()
    point[3, 4] = 125
    assert epx.Diagnose.diagnose_matrix(col) == {"abnormal_cols": [3], "abnormal_rows": [], "abnormal_points": []}
    assert epx.Diagnose.diagnose_matrix(row) == {"abnormal_cols": [], "abnormal_rows": [6], "abnormal_points": []}
    v = epx.Diagnose.diagnose_matrix(point)
    assert v["abnormal_rows"] == [] and v["abnormal_cols"] == []
    assert [p[:3] for p in v["abnormal_points"]] == [[3, 4, 125.0]]
    off = point[~np.eye(8, dtype=bool)]
    typical = (off.sum() - 125) / (off.size - 1)  # the other links (the diagonal is no link)
    assert v["abnormal_points"][0][3] == pytest.approx(125 / typical)
    assert 125 / typical < 8  # 7.9x
    assert epx.Diagnose.diagnose_matrix(point, thres_point=8.0)["abnormal_points"] == []
    with pytest.raises(epx.Error):
        epx.Diagnose.diagnose_matrix(np.zeros((3, 4)))


def test_diagnose_matrix_slow_rank_cannot_hide():
    # 8 ranks, every row ~1000 us per call, rank 5's 4000: DeepEP's ratio to the mean of all
    # rows (its own included) is under 3; to the mean of the other rows, ~4x.
    rng = np.random.default_rng(7)
    m = rng.uniform(850, 1150, (8, 8))
    np.fill_diagonal(m, 0.3)
    m[5, [d for d in range(8) if d != 5]] = 4000
    rows = m.mean(axis=1)
    assert rows[5] / rows.mean() < 3
    assert rows[5] / np.delete(rows, 5).mean() > 3.5
    assert epx.Diagnose.diagnose_matrix(m) == {"abnormal_cols": [], "abnormal_rows": [5], "abnormal_points": []}
    # A few microseconds are no fault: the same matrix in us / 100 names nothing...
    assert epx.Diagnose.diagnose_matrix(m / 100) == {"abnormal_cols": [], "abnormal_rows": [], "abnormal_points": []}
    # ... under the 50 us floor (row 5 is 40 us, ~30 us above the others); the ratios alone
    # (floor_us=0), or a floor below that excess, name it again; one above it does not.
    assert epx.Diagnose.diagnose_matrix(m / 100, floor_us=0)["abnormal_rows"] == [5]
    assert epx.Diagnose.diagnose_matrix(m / 100, floor_us=20)["abnormal_rows"] == [5]
    assert epx.Diagnose.diagnose_matrix(m / 100, floor_us=35)["abnormal_rows"] == []
    with pytest.raises(epx.Error):
        epx.Diagnose.diagnose_matrix(m, floor_us=-1)
    with pytest.raises(epx.Error):
        epx.Diagnose(None, thresholds={"flor_us": 0})  # a typo is refused, before any group is touched


def test_diagnose_matrix_spread_of_the_others():
    # Ranks whose rows differ widely (100 .. 1300 us per call) and rank 7 at 2200: 3.1x the
    # others' mean, so DeepEP's ratio names it; but it stands above the others' median by
    # less than 5 of their robust deviations (1.4826 x MAD), so the default spread does not.
    per_rank = np.array([100, 300, 500, 700, 900, 1100, 1300, 2200], dtype=np.float64)
    m = np.repeat(per_rank[:, None], 8, axis=1)
    np.fill_diagonal(m, 0.0)
    rows = m.sum(axis=1) / 7  # the same for any per-row statistic: every row has 7 links
    others = rows[:7]
    assert rows[7] / others.mean() > 3
    dev = 1.4826 * np.median(np.abs(others - np.median(others)))
    excess = rows[7] - np.median(others)
    assert 2 * dev < excess < 5 * dev
    assert epx.Diagnose.diagnose_matrix(m)["abnormal_rows"] == []
    assert epx.Diagnose.diagnose_matrix(m, spread=2)["abnormal_rows"] == [7]
    assert epx.Diagnose.diagnose_matrix(m, spread=0)["abnormal_rows"] == [7]
    with pytest.raises(epx.Error):
        epx.Diagnose.diagnose_matrix(m, spread=-1)


def _calls(buf, case, rank, n, late=-1, delay=0.0):
    x, idx, w = inputs(case, rank, "torch")
    for _ in range(n):
        if rank == late:
            time.sleep(delay)
        recv_x, _, _, handle, _ = buf.dispatch(x, idx, w, num_experts=8)
        buf.combine(recv_x, handle)


def _late_rank(rank, num_ranks, log_dir):
    case = make_case(P, 8, 2, 128, [16] * P, seed=11)
    out = {}
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=128, num_topk=2, num_experts=8) as buf:
        _calls(buf, case, rank, 2)
        # Over the group (an endpoint of its transport), the buffer watched.
        with epx.Diagnose(None, interval=10) as diag:
            diag.watch(buf)
            _calls(buf, case, rank, 10, late=1, delay=0.025)
            out["group"] = diag.exchange()
            out["shape"] = diag.matrices()["combine"].shape
    # Over a buffer whose engine is built by its first dispatch (after the Diagnose).
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=128, num_topk=2) as buf:
        with epx.Diagnose(buf, interval=10, log_dir=log_dir) as diag:  # stop() makes the one exchange
            diag.start()
            _calls(buf, case, rank, 20, late=2, delay=0.025)
            diag.stop()
            out["buffer"] = diag.diagnose()
            rep = diag.report()
            out["matrix"] = rep["dispatch"]["matrix_us"]
            out["exchanges"] = rep["exchanges"]
            out["ranks"] = diag.ranks()
    out["pid"] = os.getpid()
    return out


def test_late_rank_is_the_slow_source(tmp_path):
    got = epx.launch(_late_rank, P, str(tmp_path), start_method="fork", timeout_secs=120)
    for r, g in enumerate(got):
        assert g["buffer"]["dispatch"]["abnormal_rows"] == [2], (r, g["buffer"], g["matrix"])
        assert g["buffer"]["dispatch"]["abnormal_cols"] == [] and g["buffer"]["dispatch"]["abnormal_points"] == []
        assert g["group"]["dispatch"]["abnormal_rows"] == [1], (r, g["group"])
        assert g["shape"] == (P, P)
        assert np.array_equal(g["matrix"], got[0]["matrix"]), r  # every rank holds the same matrix
        assert g["exchanges"] == got[0]["exchanges"] >= 1
        assert [x["pid"] for x in g["ranks"]] == [x["pid"] for x in got], r
    assert (tmp_path / "diagnose.log").exists()
    assert "slow sources (rows): 2" in (tmp_path / "diagnose.log").read_text()


def _persistent(rank, num_ranks):
    # Three exchanges with rank 2, then 1, then 2 late: the persistent verdict (2 of the last 3)
    # names nobody after the second (each rank once), rank 2 after the third.
    case = make_case(P, 8, 2, 128, [16] * P, seed=11)
    out = []
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=128, num_topk=2, num_experts=8) as buf:
        _calls(buf, case, rank, 2)
        with epx.Diagnose(buf, interval=10, persist=(3, 2)) as diag:
            for late in (2, 1, 2):
                _calls(buf, case, rank, 10, late=late, delay=0.025)
                diag.exchange()
                rep = diag.report()
                out.append((diag.diagnose(), diag.persistent(), rep["window"], rep["persist"], rep["text"],
                            diag.persistent_ranks()))
    return out


def test_persistent_verdict_names_what_stays():
    got = epx.launch(_persistent, P, start_method="fork", timeout_secs=120)
    for r, g in enumerate(got):
        assert [v["dispatch"]["abnormal_rows"] for v, *_ in g] == [[2], [1], [2]], (r, g)
        assert [p["dispatch"]["abnormal_rows"] for _, p, *_ in g] == [[], [], [2]], (r, g)
        assert [w for _, _, w, *_ in g] == [1, 2, 3]
        assert g[0][3] == {"of": 3, "need": 2}
        assert "persistently (named in 2 of the last 3 intervals, 3 so far): ABNORMAL" in g[2][4]
        # Per rank over both ops (a row or a column of either): nobody after one interval (2 of
        # 3 needed), rank 2 after the third (late in the first and the third). Another rank may
        # join it under load: a column or a row of the other op counts too.
        assert g[0][5] == {"ranks": [], "links": []}, (r, g)
        assert 2 in g[2][5]["ranks"], (r, g)
        assert "slow ranks: " in g[2][4] and "2" in g[2][4].split("slow ranks: ")[1].split("\n")[0]
    with pytest.raises(epx.Error):
        epx.Diagnose(None, persist=(3, 4))  # need > of: refused before any group is touched
    with pytest.raises(epx.Error):
        epx.Diagnose(None, persist=3)
