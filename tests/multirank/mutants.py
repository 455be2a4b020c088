#!/usr/bin/python3
# The engine's known-bug mutants (docs/engine.md): applies one at a time to the source,
# rebuilds the multi-rank tests in build/, runs the suites' filter that should catch it and
# the path unit tests of the path it breaks (path_units_test.cpp), prints how many tests of
# each failed (each must be > 0), and restores the file. Run from anywhere:
#   /usr/bin/python3 tests/multirank/mutants.py [index ...]
# Leaves the tree as it was (the file is restored even on error) and rebuilds once at the end.
import subprocess, sys, re, os, time
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
M = [
 ("flag wait accepts epoch-1", "src/ep/protocols/flag.cpp",
  "m.transport.wait_flag(block + kFlagPayload, m.epoch, {phase, source_of[r]});",
  "m.transport.wait_flag(block + kFlagPayload, m.epoch - 1, {phase, source_of[r]});", "*lag*", "*PathUnit*/direct_flag"),
 ("ring writes one row past its credit", "src/ep/paths/dispatch_ring.cpp",
  "credit + c_.ring - f.done, c_.chunk", "credit + c_.ring + 1 - f.done, c_.chunk", "*Ring*", "*PathUnit*/ring_*"),
 ("relay reads the window's records (not the handle's reply rows)", "src/ep/paths/combine_relay.cpp",
  "const std::int32_t* reply_row = h.relayed_reply_row.data() + static_cast<std::size_t>(i) * lanes;",
  "const std::int32_t* reply_row = m.setup.geo.relay_record(m.setup.transport.window() + m.setup.geo.region(Region::kRelayRecord), i).reply_row;",
  "*hierarchical*:*Relay*", "*PathUnit*/relay_*"),
 ("rows-first puts not quieted before the exchange", "src/ep/channels.cpp",
  "void Buffer::Impl::Sender::finish() {\n  flush();",
  "void Buffer::Impl::Sender::finish() {\n  if (signal_slot_ != kNoSignal) flush();", "*deferred*:*Deferred*", "*PathUnit*/rows_first_*"),
 ("one flag staging block shared by every queue", "src/ep/channels.cpp",
  "return stage_.data() + static_cast<std::size_t>(q) * proto_.stage_bytes();",
  "return stage_.data() + 0 * q;", "*Deferred*flag*:*deferred_Flag*", "*PathUnit*/direct_flag"),
 ("node first: the relay forwards one reply of a server, not their sum", "src/ep/paths/combine_relay.cpp",
  "if (n == 1) std::memcpy(out, rows_[0], row_bytes);", "if (n >= 1) std::memcpy(out, rows_[0], row_bytes);", "*nodefirst*", "*NodeFirst*"),
 ("node first: the relay reads the window's records (not the handle's reply rows)", "src/ep/paths/combine_relay.cpp",
  "const std::int32_t* reply_row = h.relayed_reply_row.data() + at;",
  "const std::int32_t* reply_row = m_.setup.geo.relay_record(m_.setup.transport.window() + m_.setup.geo.region(Region::kRelayRecord), i).reply_row;",
  "*NodeFirst*:*nodefirst*", "*NodeFirstRelays*"),
 ("the blocked send skips a token at every block edge", "src/ep/paths/dispatch_direct.cpp",
  "b0 < t1; b0 += block) {", "b0 < t1; b0 += block + 1) {", "*Deferred*", "DeferredPutBlocks.*"),
]
which = [int(a) for a in sys.argv[1:]] or range(len(M))
caught = True
for i in which:
    name, path, old, new, filt, unit = M[i]
    src = open(path).read()
    assert src.count(old) == 1, name
    open(path, 'w').write(src.replace(old, new))
    try:
        b = subprocess.run(['cmake', '--build', 'build', '-j2', '--target', 'epx_multirank_tests'], capture_output=True, text=True)
        if b.returncode != 0:
            caught = False
            print(f"MUTANT {i} {name}: BUILD FAILED\n{b.stdout[-2000:]}", flush=True)
            continue
        for f in (filt, unit):
            t0 = time.time()
            r = subprocess.run(['timeout', '900', './build/tests/epx_multirank_tests', '--gtest_brief=1', '--gtest_filter=' + f],
                               capture_output=True, text=True)
            out = r.stdout
            ran = re.search(r'(\d+) tests? from .* ran', out)
            passed = re.search(r'PASSED  \] (\d+) test', out)
            failed = int(ran.group(1)) - (int(passed.group(1)) if passed else 0) if ran else '?'
            caught = caught and failed not in (0, '?')
            names = sorted(set(re.findall(r'\[  FAILED  \] (\S+)', out)))
            print(f"MUTANT {i} {name}: filter {f}: ran {ran.group(1) if ran else '?'}, failed {failed}"
                  f", rc {r.returncode}, {time.time()-t0:.0f} s; failed e.g. {names[:4]}", flush=True)
    finally:
        open(path, 'w').write(src)
subprocess.run(['cmake', '--build', 'build', '-j2', '--target', 'epx_multirank_tests'], capture_output=True)
sys.exit(0 if caught else 1)
