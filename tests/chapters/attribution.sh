#!/usr/bin/env bash
# --attribute and --delay-rank (common/report/attribution.hpp), end to end:
#  - the account's parts add up to the step the driver measured: rank 0's mean account over
#    steps 2..S against the mean of its step records' ms_per_step (another clock, read around
#    the step), within 5 % (the two clocks are read microseconds apart, a step takes
#    milliseconds); forward, backward and optimizer are > 0 everywhere, communication > 0 at
#    N = 3 and exactly 0 on one process (chapter 01 has no communicator);
#  - a planted straggler (--delay-rank 1:200, rank 1 sleeps 200 ms per step) is named as the
#    late rank in chapters 03, 04, 05 and 08, and the others wait at least 150 ms per step
#    longer than it does (200 ms less scheduling slack on an oversubscribed machine); the rank
#    that receives from it spends those >= 150 ms in peer_wait, not transfer: rank 0 in 03 (the
#    central reducer receives from rank 1), rank 2 in the rings of 04, 05 and 08;
#  - ZeRO-3's shard copies show as copies (> 0 ms per step in 08);
#  - the account changes no number: chapters 05 and 08 at N = 2 with --attribute and a delay,
#    and with --no-overlap, end bitwise as without, with the same bytes per step;
#  - scripts/plot attribution draws the runs (where matplotlib is installed);
#  - one measured step or none says so instead of a table of zeros;
#  - bad input is refused by every rank, naming the value and the fix (--no-overlap where no
#    communication thread runs included).
source "$(dirname "$0")/lib.bash"
SRC=${SRC:-$(cd "$(dirname "$0")/../.." && pwd)}

common=(--model mlp --global-batch-size 48 --max-steps 6 --eval-every-epoch 0 --seed 3)

run ch01 0 ch01_training_loop "${common[@]}" --attribute
for ch in 03_data_parallel 04_ring_allreduce 05_ddp_buckets 08_zero3; do
  run "clean_$ch" 3 "ch$ch" "${common[@]}" --attribute
  run "late_$ch" 3 "ch$ch" "${common[@]}" --attribute --delay-rank 1:200
  grep -q "late rank: 1 (the other ranks wait" "$WORK/late_$ch.log" || {
    echo "FAILED: ch$ch did not name rank 1"; cat "$WORK/late_$ch.log"; exit 1; }
done

run one_step 2 ch05_ddp_buckets --model mlp --global-batch-size 48 --max-steps 1 --eval-every-epoch 0 --attribute
grep -q "no step measured (the first step, warm-up, is left out); run at least 2 steps" \
  "$WORK/one_step.log" || { echo "FAILED: one step printed a table"; cat "$WORK/one_step.log"; exit 1; }

check_summaries <<'PY'
def steps_ms(name):
    ms = [json.loads(l)["ms_per_step"] for l in open(f"{W}/{name}.jsonl") if '"step"' in l]
    return sum(ms[1:]) / len(ms[1:])  # the account leaves the first step out too
def check(name, ranks):
    a = summary(name)["attribution"]
    assert a["steps"] == 5 and len(a["ranks"]) == ranks, a
    for r in a["ranks"]:
        parts = [r[p + "_ms"] for p in ("forward", "backward", "optimizer", "communication", "peer_wait", "copies", "other")]
        assert all(p >= 0 for p in parts) and abs(sum(parts) - r["step_ms"]) < 1e-9, r
        assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["optimizer_ms"] > 0, r
        assert (r["communication_ms"] > 0) if ranks > 1 else (r["communication_ms"] == 0), r
    measured, account = steps_ms(name), a["ranks"][0]["step_ms"]
    assert abs(account - measured) <= 0.05 * measured, (name, account, measured)
    print(f"ok: {name}: rank 0's parts sum to {account:.3f} ms per step, measured {measured:.3f}")
    return a
check("ch01", 1)
for ch in ("03_data_parallel", "04_ring_allreduce", "05_ddp_buckets", "08_zero3"):
    check("clean_" + ch, 3)
    a = check("late_" + ch, 3)
    assert a["late_rank"] == 1 and a["late_by_ms"] >= 150, a
    receiver = 0 if ch == "03_data_parallel" else 2  # the rank that receives from rank 1
    waits = [round(r["peer_wait_ms"], 1) for r in a["ranks"]]
    assert waits[receiver] >= 150, (ch, waits)
    print(f"ok: ch{ch}: late rank 1, the others wait {a['late_by_ms']:.1f} ms per step longer; "
          f"peer_wait per rank {waits} ms")
for name in ("clean_08_zero3", "late_08_zero3"):
    copies = [r["copies_ms"] for r in summary(name)["attribution"]["ranks"]]
    assert all(c > 0 for c in copies), (name, copies)
print("ok: ch08's shard copies show as copies on every rank")
PY

# scripts/plot draws the account (scripts/setup installs matplotlib): a PNG of the straggler runs.
plot_python=$(sed -n '1s/^#!//p' "$SRC/scripts/plot")  # the interpreter scripts/plot runs with
if $plot_python -c 'import matplotlib' 2>/dev/null; then
  "$SRC/scripts/plot" attribution "$WORK/late_04_ring_allreduce.jsonl" "$WORK/late_08_zero3.jsonl" \
    -o "$WORK/account.png" >/dev/null
  expect_eq "$(head -c 4 "$WORK/account.png" | tail -c 3)" "PNG" "scripts/plot attribution"
else
  echo "note: no matplotlib here, scripts/plot attribution not tried"
fi

for ch in 05_ddp_buckets 08_zero3; do
  run "plain_$ch" 2 "ch$ch" "${common[@]}"
  run "account_$ch" 2 "ch$ch" "${common[@]}" --attribute --delay-rank 0:20
  run "serial_$ch" 2 "ch$ch" "${common[@]}" --attribute --no-overlap
  for variant in account serial; do
    same "plain_$ch" "${variant}_$ch" --bitwise
    expect_eq "$(sent "${variant}_$ch")" "$(sent "plain_$ch")" "ch$ch bytes per step, $variant"
  done
done

fails delay_no_rank 3 ch04_ring_allreduce "rank 3 does not exist at 3 ranks; give a rank 0..2" \
  "${common[@]}" --delay-rank 3:10
fails delay_form 2 ch05_ddp_buckets "--delay-rank 1: no ':'; give R:MS" "${common[@]}" --delay-rank 1
fails delay_ms 2 ch05_ddp_buckets "'-5' is not a delay in \(0, 60000\] ms" "${common[@]}" \
  --delay-rank 1:-5
fails no_overlap_without_queue 2 ch04_ring_allreduce "no overlap to turn off. Use it with chapters 05-08" \
  "${common[@]}" --no-overlap
fails delay_one_process 0 ch01_training_loop "runs on one process; no rank waits" \
  "${common[@]}" --delay-rank 0:5
