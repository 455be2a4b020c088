// The discrete-event timing of one call. Per rank: its streams (rank thread + workers)
// execute their recorded ops in order; each queue is a FIFO work-request processor; the
// egress port, the ingress port and the memory are FIFO servers that move data in chunks,
// so incast and contention emerge from the queueing. See docs/sim.md.
#include <algorithm>
#include <deque>
#include <set>
#include <unordered_map>
#include <variant>

#include "epx/error.hpp"
#include "epx/sim/timing.hpp"
#include "epx/sim/events.hpp"
#include "timing_state.hpp"

namespace epx::sim {

namespace {

using namespace timing_state;

class CallTimer {
 public:
  CallTimer(const Trace& trace, int call, const HardwareModel& hw, const std::vector<RankCompute>& compute,
            const Topology& topology)
      : hw_(hw), P_(trace.num_ranks), compute_(compute) {
    ranks_.resize(static_cast<std::size_t>(P_));
    places_ = topology.ranks;
    for (int r = 0; r < P_; ++r) {
      // Signal values a poll may have seen before this call started: the largest value of
      // each slot signalled in earlier calls (not setup: Buffer creation reallocates).
      for (const StreamTrace& st : trace.ranks[static_cast<std::size_t>(r)].streams)
        for (const TraceOp& op : st.ops) {
          if ((op.kind == OpKind::kPut || op.kind == OpKind::kPutFlagged) && op.call == static_cast<std::uint32_t>(call) &&
              op.peer != r && scaleout(r, op.peer))
            rank(r).nic_call = true;
          if (op.kind != OpKind::kSignal) continue;
          if (op.call >= 1 && op.call < static_cast<std::uint32_t>(call)) {
            std::uint64_t& v = rank(op.peer).carried[op.key];
            v = std::max(v, op.value);
          } else if (op.call == static_cast<std::uint32_t>(call)) {
            std::uint64_t& v = rank(op.peer).call_max[op.key];
            v = std::max(v, op.value);
          }
        }
    }
    for (int r = 0; r < P_; ++r) {
      Rank& rk = ranks_[static_cast<std::size_t>(r)];
      rk.queue_free.assign(kQueues, Picoseconds{0});
      rk.memory.set_rate(hw.memory_bandwidth);
      rk.vector.set_rate(hw.reduce_bandwidth);
      if (const auto& red = compute_of(r).reduction) {
        rk.landed_bytes.assign(static_cast<std::size_t>(P_), 0);
        rk.landed_rows.assign(static_cast<std::size_t>(P_), 0);
        rk.waiting = red->partials;
        rk.summed.assign(red->partials.size(), Picoseconds{0});
      }
      const RankTrace& rt = trace.ranks[static_cast<std::size_t>(r)];
      int active = 0;
      for (std::size_t s = 0; s < rt.streams.size(); ++s) {
        Stream st;
        st.rank = r;
        const std::vector<TraceOp>& all = rt.streams[s].ops;
        for (std::size_t i = 0; i < all.size(); ++i)
          if (all[i].call == static_cast<std::uint32_t>(call)) {
            if (st.ops.empty()) st.first_op = i;
            st.ops.push_back(&all[i]);
          }
        rk.of_trace.push_back(-1);
        if (s != 0 && st.ops.empty()) continue;
        rk.of_trace.back() = static_cast<std::int64_t>(streams_.size());
        if (!st.ops.empty()) ++active;
        st.issued.assign(kQueues, 0);
        st.incomplete.resize(kQueues);
        st.pending.resize(kQueues);
        st.last_peer.assign(kQueues, r);
        rk.streams.push_back(static_cast<std::uint32_t>(streams_.size()));
        streams_.push_back(std::move(st));
      }
      rk.parallel = std::max(1, hw_.workers_per_rank / std::max(1, active));
    }
  }

  CallTiming run() {
    const Picoseconds launch = hw_.launch_init.to_ps();
    for (int r = 0; r < P_; ++r) {
      const Rank& rk = ranks_[static_cast<std::size_t>(r)];
      const RankCompute& c = compute_of(r);
      const Picoseconds plan = Nanoseconds{hw_.plan_per_slot.ns * static_cast<double>(c.plan_slots) +
                                           hw_.plan_per_count.ns * static_cast<double>(c.plan_counts) +
                                           hw_.dense_scan_per_cell.ns * static_cast<double>(c.dense_cells)}
                                   .to_ps();
      for (std::size_t i = 0; i < rk.streams.size(); ++i) {
        Stream& s = streams_[rk.streams[i]];
        const Picoseconds start = i == 0 ? launch + plan : launch;
        if (i == 0) s.control = start;
        run_at(rk.streams[i], start);
      }
    }
    q_.run([&](Picoseconds now, Event& e) { std::visit([&](auto& ev) { handle(now, ev); }, e); });

    CallTiming out;
    out.events = q_.processed();
    out.ranks.resize(static_cast<std::size_t>(P_));
    for (int r = 0; r < P_; ++r) {
      Rank& rk = ranks_[static_cast<std::size_t>(r)];
      RankTiming& t = rk.timing;
      Picoseconds end{0};
      for (std::uint32_t si : rk.streams) {
        Stream& s = streams_[si];
        if (s.block != Block::kDone)
          throw Error(ErrorCode::kInternal, "sim timing: rank " + std::to_string(r) + " stream blocked forever at op " +
                                                std::to_string(s.pos) + " (" + to_string(s.ops[s.pos]->kind) + ")");
        end = max(end, s.end);
      }
      release_peers(r);
      const Stream& main = streams_[rk.streams[0]];
      t.control = main.control;
      t.data = main.data;
      t.sync = main.sync;
      if (rk.reduce_end > end) {  // the last sums finish after the rank's last op
        t.reduce_tail = rk.reduce_end - end;
        end = rk.reduce_end;
      }
      const Picoseconds extra = compute_of(r).extra_sync;
      t.sync += extra;
      end += extra;
      t.total = end;
      const Picoseconds accounted = t.control + t.data + t.sync;
      if (accounted < t.total) t.data += t.total - accounted;  // workers running past the rank thread
      out.ranks[static_cast<std::size_t>(r)] = t;
      out.max_rank = max(out.max_rank, t.total);
    }
    return out;
  }

 private:
  const RankCompute& compute_of(int r) const {
    static const RankCompute none{};
    return compute_.empty() ? none : compute_[static_cast<std::size_t>(r)];
  }
  Rank& rank(int r) { return ranks_[static_cast<std::size_t>(r)]; }
  Picoseconds lat(int src, int dst) const {
    return hw_.latency(src, dst, place(src), place(dst));
  }
  const RankPlace& place(int r) const { return places_[static_cast<std::size_t>(r)]; }
  bool scaleout(int src, int dst) const { return hw_.scaleout(place(src), place(dst)); }
  // The scale-up egress rate of a rank: link_bandwidth, or its scaleup_share_with_nic in a
  // call where the rank also puts through its NIC (docs/sim.md §2, "scale-out").
  GBps scaleup_rate(const Rank& r) const {
    const double share = hw_.scaleup_share_with_nic;
    return r.nic_call && share > 0 ? GBps{hw_.link_bandwidth.gbps * share} : hw_.link_bandwidth;
  }
  // A message through the NIC (scale-out) waits for its processing there too.
  Picoseconds nic_ready(int src, int dst, Picoseconds now, Picoseconds ready, std::uint32_t messages) {
    if (!scaleout(src, dst)) return ready;
    Picoseconds& nf = rank(src).nic_wr_free;
    nf = max(now, nf) + Nanoseconds{hw_.scaleout_wr_time.ns * static_cast<double>(messages)}.to_ps();
    return max(ready, nf);
  }

  // ---- streams ----
  void handle(Picoseconds now, RunStream& ev) { step(ev.stream, now); }

  void finish_wait(std::uint32_t si, Picoseconds resume, bool payload) {
    Stream& s = streams_[si];
    const Picoseconds blocked = resume - s.block_start;
    (payload ? s.data : s.sync) += blocked;
    const TraceOp& op = *s.ops[s.pos];
    s.block = Block::kNone;
    ++s.pos;
    if (op.wait_index > 0) main_wait_done(s.rank, op.wait_index, resume);
    run_at(si, resume);
  }

  void main_wait_done(int r, std::uint64_t index, Picoseconds t) {
    Rank& rk = rank(r);
    rk.main_wait_done[index] = t;
    auto it = rk.dep_waiters.find(index);
    if (it == rk.dep_waiters.end()) return;
    for (std::uint32_t si : it->second) {
      Stream& w = streams_[si];
      w.block = Block::kNone;
      ++w.pos;
      run_at(si, t);
    }
    rk.dep_waiters.erase(it);
  }

  void run_at(std::uint32_t si, Picoseconds t) {
    streams_[si].ready = t;
    q_.schedule(t, RunStream{si});
  }

  // A worker stream at `now` has completed its first pos ops: the rank thread joining it
  // there goes on (the time it waited counts as data: workers putting rows).
  void release_joiners(Stream& w, Picoseconds now) {
    for (std::size_t i = 0; i < w.joiners.size();) {
      if (w.pos < w.joiners[i].ops) {
        ++i;
        continue;
      }
      const std::uint32_t mi = w.joiners[i].stream;
      Stream& m = streams_[mi];
      m.data += now - m.block_start;
      m.block = Block::kNone;
      ++m.pos;
      run_at(mi, now);
      w.joiners.erase(w.joiners.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // Runs stream si's ops from `now` until one blocks it or takes time (then it runs again
  // at the time the op ends); each op kind's handler says whether the stream goes on at once.
  void step(std::uint32_t si, Picoseconds now) {
    Stream& s = streams_[si];
    while (true) {
      release_joiners(s, now);
      if (s.pos >= s.ops.size()) {
        s.block = Block::kDone;
        s.end = now;
        return;
      }
      if (!step_op(si, *s.ops[s.pos], now)) return;
    }
  }

  bool step_op(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    switch (op.kind) {
      case OpKind::kAfterMainWait:
        return after_main_wait(si, op, now);
      case OpKind::kJoin:
        return join(si, op, now);
      case OpKind::kPut:
      case OpKind::kPutFlagged:
        issue_put(si, op, now);
        return false;
      case OpKind::kSignal:
        issue_signal(si, op, now);
        return false;
      case OpKind::kQuiet:
        quiet(si, op, now);
        return false;
      case OpKind::kPollSignal:
        if (poll_already_satisfied(rank(s.rank), op)) {
          ++s.pos;
          return true;
        }
        [[fallthrough]];
      case OpKind::kWaitSignal:
      case OpKind::kWaitFlag:
        return wait(si, op, now);
      case OpKind::kBarrier:
        barrier(si, now);
        return false;
    }
    return false;
  }

  bool after_main_wait(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    Rank& rk = rank(s.rank);
    if (op.key == 0) {
      ++s.pos;
      return true;
    }
    auto it = rk.main_wait_done.find(op.key);
    if (it != rk.main_wait_done.end()) {
      ++s.pos;
      if (it->second > now) {
        run_at(si, it->second);
        return false;
      }
      return true;
    }
    if (!main_has_wait(s.rank, op.key)) {  // the fork point lies in an earlier call
      ++s.pos;
      return true;
    }
    s.block = Block::kDep;
    rk.dep_waiters[op.key].push_back(si);
    return false;
  }

  bool join(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    Rank& rk = rank(s.rank);
    const auto k = static_cast<std::size_t>(op.peer);
    const std::int64_t wi = k < rk.of_trace.size() ? rk.of_trace[k] : -1;
    if (wi < 0) {  // that worker did nothing in this call
      ++s.pos;
      return true;
    }
    Stream& w = streams_[static_cast<std::size_t>(wi)];
    const std::size_t need = op.key > w.first_op ? std::min<std::size_t>(op.key - w.first_op, w.ops.size()) : 0;
    if (w.pos >= need) {
      ++s.pos;
      if (w.ready > now) {  // its last op is still under way
        s.data += w.ready - now;
        run_at(si, w.ready);
        return false;
      }
      return true;
    }
    s.block = Block::kDep;
    s.block_start = now;
    w.joiners.push_back({need, si});
    return false;
  }

  // One doorbell per batch: a put record is a batch (consecutive puts to one (peer,
  // queue) are coalesced); data-as-flag blocks are recorded one by one (each has its
  // flag) but a run of them to the same (peer, queue) is one batch too.
  void issue_put(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    Rank& rk = rank(s.rank);
    const RankCompute& comp = compute_of(s.rank);
    const auto q = static_cast<std::size_t>(op.queue);
    const TraceOp* prev = s.pos > 0 ? s.ops[s.pos - 1] : nullptr;
    const bool same_batch = op.kind == OpKind::kPutFlagged && prev != nullptr && prev->kind == OpKind::kPutFlagged &&
                            prev->peer == op.peer && prev->queue == op.queue;
    const Picoseconds cost = (same_batch ? Picoseconds{0} : hw_.doorbell.to_ps()) +
                             Nanoseconds{hw_.put_issue.ns * static_cast<double>(op.count) / rk.parallel}.to_ps();
    const Picoseconds t_end = now + cost;
    s.control += cost;
    Picoseconds& qf = rk.queue_free[q];
    qf = max(now, qf) + Nanoseconds{hw_.queue_wr_time.ns * static_cast<double>(op.count)}.to_ps();
    const Picoseconds ready = nic_ready(s.rank, op.peer, now, max(qf, t_end), op.count);
    const auto payload = static_cast<std::uint64_t>(static_cast<double>(op.payload_bytes) * comp.payload_scale);
    Record rec{};
    rec.stream = si;
    rec.src = s.rank;
    rec.peer = op.peer;
    rec.queue = op.queue;
    rec.seq = ++s.issued[q];
    rec.bytes = op.bytes - op.payload_bytes + payload;
    rec.raw_payload = op.payload_bytes;
    rec.pre_mem = static_cast<std::uint64_t>(static_cast<double>(payload) * comp.read_per_payload_byte);
    rec.pre_vec = static_cast<std::uint64_t>(static_cast<double>(payload) * comp.presum_per_payload_byte);
    rec.flagged = op.kind == OpKind::kPutFlagged;
    rec.flag_key = op.key;
    rec.flag_value = op.value;
    s.incomplete[q].insert(rec.seq);
    s.last_peer[q] = op.peer;
    if (payload > 0) s.payload_issued = true;
    rk.timing.puts += op.count;
    rk.timing.payload_bytes += payload;
    if (op.peer != s.rank) rk.timing.remote_bytes += rec.bytes;
    rec.issued = now;
    records_.push_back(rec);
    launch_record(static_cast<std::uint32_t>(records_.size() - 1), now, ready);
    ++s.pos;
    run_at(si, t_end);
  }

  void issue_signal(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    Rank& rk = rank(s.rank);
    const auto q = static_cast<std::size_t>(op.queue);
    const Picoseconds cost = hw_.signal_issue.to_ps();
    const Picoseconds t_end = now + cost;
    s.control += cost;
    Picoseconds& qf = rk.queue_free[q];
    qf = max(now, qf) + hw_.queue_wr_time.to_ps();
    const Picoseconds ready = nic_ready(s.rank, op.peer, now, max(qf, t_end), 1);
    if (s.incomplete[q].empty())
      q_.schedule(ready + lat(s.rank, op.peer), Deliver{op.peer, op.key, op.value, false, s.payload_issued});
    else
      s.pending[q].push_back({s.issued[q], op.peer, op.key, op.value, ready, s.payload_issued});
    ++s.pos;
    run_at(si, t_end);
  }

  // A quiet in the middle of a put loop (the next op is a put: a staging buffer is
  // reused) stalls only one of the hardware workers this stream stands for; the
  // others keep issuing, so with parallel > 1 it costs its latency share only.
  // (A run of quiets, one per queue, followed by a put is the same staging reuse.)
  void quiet(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    const Rank& rk = rank(s.rank);
    const auto q = static_cast<std::size_t>(op.queue);
    std::size_t next = s.pos + 1;
    while (next < s.ops.size() && s.ops[next]->kind == OpKind::kQuiet) ++next;
    const bool staging = rk.parallel > 1 && next < s.ops.size() &&
                         (s.ops[next]->kind == OpKind::kPut || s.ops[next]->kind == OpKind::kPutFlagged);
    if (staging) {
      const Picoseconds t = now + Picoseconds{hw_.quiet_latency.to_ps().ps / rk.parallel};
      s.sync += t - now;
      ++s.pos;
      run_at(si, t);
      return;
    }
    if (s.incomplete[q].empty()) {
      const Picoseconds t = now + hw_.quiet_latency.to_ps();
      s.sync += hw_.quiet_latency.to_ps();
      ++s.pos;
      run_at(si, t);
      return;
    }
    s.block = Block::kQuiet;
    s.block_queue = op.queue;
    s.block_start = now;
  }

  bool wait(std::uint32_t si, const TraceOp& op, Picoseconds now) {
    Stream& s = streams_[si];
    Rank& rk = rank(s.rank);
    const bool flag = op.kind == OpKind::kWaitFlag;
    auto& values = flag ? rk.flags : rk.slots;
    auto it = values.find(op.key);
    if (it != values.end() && it->second >= op.value) {
      ++s.pos;
      if (op.wait_index > 0) main_wait_done(s.rank, op.wait_index, now);
      return true;
    }
    s.block = Block::kWait;
    s.block_start = now;
    (flag ? rk.flag_waiters : rk.slot_waiters)[op.key].push_back({si, op.value});
    return false;
  }

  void barrier(std::uint32_t si, Picoseconds now) {
    Stream& s = streams_[si];
    s.block = Block::kBarrier;
    s.block_start = now;
    barrier_waiting_.push_back(si);
    barrier_latest_ = max(barrier_latest_, now);
    if (static_cast<int>(barrier_waiting_.size()) == P_) q_.schedule(barrier_latest_ + hw_.barrier_cost(P_), BarrierRelease{});
  }

  // A poll loop that observed `value`: its next ops wait for it. A value older than this
  // call (left by an earlier call, or never signalled in it) was there already.
  static bool poll_already_satisfied(const Rank& rk, const TraceOp& op) {
    const auto carried = rk.carried.find(op.key);
    if (carried != rk.carried.end() && op.value <= carried->second) return true;
    const auto in_call = rk.call_max.find(op.key);
    return in_call == rk.call_max.end() || op.value > in_call->second;
  }

  bool main_has_wait(int r, std::uint64_t index) {
    const Stream& m = streams_[rank(r).streams[0]];
    for (const TraceOp* op : m.ops)
      if (op->wait_index == index) return true;
    return false;
  }

  void handle(Picoseconds now, BarrierRelease&) {
    for (std::uint32_t si : barrier_waiting_) finish_wait(si, now, false);
    barrier_waiting_.clear();
    barrier_latest_ = Picoseconds{0};
  }

  // ---- data path ----
  // Chunk c of a record becomes available as the record's work requests are processed
  // (progressively over [issue, ready]); the sender reads it from memory (paced with its
  // egress port: no earlier than the port needs it), the egress port sends it, and after
  // the latency it queues at the target's ingress port and memory.
  void launch_record(std::uint32_t id, Picoseconds now, Picoseconds ready) {
    const Record& rec = records_[id];
    Rank& src = rank(rec.src);
    const std::uint64_t chunk = hw_.chunk_bytes.n;
    const std::uint64_t n = std::max<std::uint64_t>(1, (rec.bytes + chunk - 1) / chunk);
    const Picoseconds latency = lat(rec.src, rec.peer);
    const bool nic = scaleout(rec.src, rec.peer);
    const GBps port_rate = nic ? hw_.scaleout_bandwidth : scaleup_rate(src);
    Picoseconds& egress = nic ? src.nic_egress_free : src.egress_free;
    std::uint64_t left = rec.bytes;
    for (std::uint64_t c = 0; c < n; ++c) {
      const std::uint64_t size = std::min(left, chunk);
      left -= size;
      const bool last = c + 1 == n;
      const Picoseconds avail = now + Picoseconds{(ready - now).ps * static_cast<std::int64_t>(c + 1) / static_cast<std::int64_t>(n)};
      const double share = rec.bytes > 0 ? static_cast<double>(size) / static_cast<double>(rec.bytes) : 0.0;
      const auto read = static_cast<std::uint64_t>(static_cast<double>(rec.pre_mem) * share);
      const auto vec = static_cast<std::uint64_t>(static_cast<double>(rec.pre_vec) * share);
      // The pre-sum of the chunk's rows on the vector units (combine) precedes its put.
      const Picoseconds summed = vec > 0 ? src.vector.serve(avail, vec) : avail;
      const Picoseconds wire = port_rate.time_for(Bytes{size});
      if (rec.peer == rec.src) {
        // Local: read + write through this rank's memory, moved chunk by chunk at the data
        // mover's rate (local_copy_bandwidth, its own path: not the egress port). Unpaced, a
        // large local put booked the whole memory bandwidth from its start and pushed the
        // remote sends' reads behind it (the port idled while it ran).
        const Picoseconds copy = hw_.local_copy_bandwidth.time_for(Bytes{size});
        src.local_free = max(summed, src.local_free) + copy;
        const Picoseconds done = src.memory.serve(src.local_free - copy, read + size);
        if (last) q_.schedule(done + hw_.local_latency.to_ps(), RecordDone{id});
        continue;
      }
      Picoseconds send = summed;
      if (read > 0) {
        send = src.memory.serve(max(summed, egress - wire), read);
      }
      egress = max(send, egress) + wire;
      q_.schedule(egress + latency, IngressArrive{id, static_cast<std::uint32_t>(size), last, nic});
    }
  }

  void handle(Picoseconds now, IngressArrive& ev) {
    Rank& dst = rank(records_[ev.record].peer);
    Picoseconds& ingress = ev.scaleout ? dst.nic_ingress_free : dst.ingress_free;
    ingress = max(now, ingress) + (ev.scaleout ? hw_.scaleout_bandwidth : hw_.link_bandwidth).time_for(Bytes{ev.bytes});
    q_.schedule(ingress, MemoryArrive{ev.record, ev.bytes, ev.last});
  }

  void handle(Picoseconds now, MemoryArrive& ev) {
    Rank& dst = rank(records_[ev.record].peer);
    const Picoseconds done = dst.memory.serve(now, ev.bytes);
    if (ev.last) q_.schedule(done, RecordDone{ev.record});
  }

  // A combine's partial rows from `rec.src` landed at `rec.peer`: the tokens whose last
  // partial this was are summed now — read back, widened and added on the vector units,
  // written once as BF16 — in the rank's memory alongside the writes still arriving.
  void partials_landed(const Record& rec, Picoseconds now) {
    const auto& red = compute_of(rec.peer).reduction;
    if (!red || rec.raw_payload == 0 || red->row_bytes == 0) return;
    Rank& dst = rank(rec.peer);
    const auto from = static_cast<std::size_t>(rec.src);
    const std::vector<std::int32_t>& order = red->from[from];
    dst.landed_bytes[from] += rec.raw_payload;
    const std::size_t rows = std::min<std::size_t>(order.size(), dst.landed_bytes[from] / red->row_bytes);
    const double row = static_cast<double>(red->row_bytes) * compute_of(rec.peer).payload_scale;
    for (std::size_t i = dst.landed_rows[from]; i < rows; ++i) {
      const auto t = static_cast<std::size_t>(order[i]);
      if (dst.waiting[t] == 0 || --dst.waiting[t] != 0) continue;
      const double n = red->partials[t];
      const Picoseconds summed = dst.vector.serve(now, static_cast<std::uint64_t>(n * row));
      const Picoseconds moved =
          compute_of(rec.peer).reduction_memory ? dst.memory.serve(now, static_cast<std::uint64_t>((n + 1) * row)) : now;
      dst.summed[t] = max(summed, moved);
      dst.reduce_end = max(dst.reduce_end, dst.summed[t]);
    }
    dst.landed_rows[from] = rows;
  }

  // The source's per-peer completion of a combine: a peer's receive area is handed back
  // once every partial it sent has been summed, one peer after another — ring bookkeeping
  // (combine_peer_release) and a credit to the peer whose acknowledgement comes back before
  // the next (the round trip to that peer, from the topology). Local partials need no
  // hand-back. With the last sums at the end of the call, this adds, after the last sum,
  // the sum over the R-1 remote peers of (bookkeeping + round trip).
  void release_peers(int r) {
    const auto& red = compute_of(r).reduction;
    if (!red || !compute_of(r).peer_release || !hw_.combine_handback) return;
    Rank& rk = rank(r);
    std::vector<std::pair<Picoseconds, int>> ready;  // (its last sum done, peer)
    for (int p = 0; p < P_; ++p) {
      const std::vector<std::int32_t>& tokens = red->from[static_cast<std::size_t>(p)];
      if (p == r || tokens.empty()) continue;
      Picoseconds last{0};
      for (std::int32_t t : tokens) last = max(last, rk.summed[static_cast<std::size_t>(t)]);
      ready.emplace_back(last, p);
    }
    std::sort(ready.begin(), ready.end());
    Picoseconds done{0};
    for (const auto& [t, p] : ready) done = max(done, t) + hw_.combine_peer_release.to_ps() + lat(r, p) + lat(p, r);
    rk.reduce_end = max(rk.reduce_end, done);
  }

  void handle(Picoseconds now, RecordDone& ev) {
    const Record rec = records_[ev.record];
    if (rec.src != rec.peer && rec.raw_payload > 0) {
      RankTiming& t = rank(rec.src).timing;
      PortUse& u = scaleout(rec.src, rec.peer) ? t.nic_out : t.scaleup_out;
      u.first = u.bytes == 0 ? rec.issued : min(u.first, rec.issued);
      u.last = max(u.last, now);
      u.bytes += rec.bytes;
    }
    partials_landed(rec, now);
    Stream& s = streams_[rec.stream];
    const auto q = static_cast<std::size_t>(rec.queue);
    if (rec.flagged) {
      Deliver d{rec.peer, rec.flag_key, rec.flag_value, true, true};
      handle(now, d);
    }
    s.incomplete[q].erase(rec.seq);
    const std::uint64_t oldest = s.incomplete[q].empty() ? ~std::uint64_t{0} : *s.incomplete[q].begin();
    while (!s.pending[q].empty() && s.pending[q].front().watermark < oldest) {
      const PendingSignal p = s.pending[q].front();
      s.pending[q].pop_front();
      // An ordered signal travels behind the data on the same path.
      q_.schedule(max(now, p.ready + lat(rec.src, p.peer)), Deliver{p.peer, p.slot, p.value, false, p.after_payload});
    }
    if (s.block == Block::kQuiet && static_cast<std::size_t>(s.block_queue) == q && s.incomplete[q].empty()) {
      // The completion travels back to the sender, then quiet returns.
      const Picoseconds ack = lat(rec.peer, rec.src);
      const Picoseconds resume = now + ack + hw_.quiet_latency.to_ps();
      const Picoseconds drained = now + ack;
      (s.payload_issued ? s.data : s.sync) += drained - s.block_start;
      s.sync += hw_.quiet_latency.to_ps();
      s.block = Block::kNone;
      ++s.pos;
      run_at(rec.stream, resume);
    }
  }

  void handle(Picoseconds now, Deliver& ev) {
    Rank& rk = rank(ev.rank);
    auto& values = ev.flag ? rk.flags : rk.slots;
    std::uint64_t& v = values[ev.key];
    v = std::max(v, ev.value);
    auto& waiters = ev.flag ? rk.flag_waiters : rk.slot_waiters;
    auto it = waiters.find(ev.key);
    if (it == waiters.end()) return;
    std::vector<Waiter>& list = it->second;
    for (std::size_t i = 0; i < list.size();) {
      if (list[i].at_least <= v) {
        finish_wait(list[i].stream, now + hw_.poll_latency.to_ps(), ev.after_payload);
        list[i] = list.back();
        list.pop_back();
      } else {
        ++i;
      }
    }
    if (list.empty()) waiters.erase(it);
  }

  const HardwareModel& hw_;
  int P_;
  const std::vector<RankCompute>& compute_;
  std::vector<Rank> ranks_;
  std::vector<RankPlace> places_;  // [P] where each rank sits (frame, server), from the topology table
  std::vector<Stream> streams_;
  std::vector<Record> records_;
  std::vector<std::uint32_t> barrier_waiting_;
  Picoseconds barrier_latest_{0};
  EventQueue<Event> q_;
};

}  // namespace

std::string default_topology_spec(int num_ranks, const HardwareModel& hw) {
  if (num_ranks == 128 && hw.frames == 2 && hw.ranks_per_frame == 64) return "builtin:supernode128";
  return num_ranks % 8 == 0 ? "builtin:servers:8" : "builtin:flat";
}

CallTiming time_call(const Trace& trace, int call, const HardwareModel& hw, const std::vector<RankCompute>& compute) {
  return time_call(trace, call, hw, compute, load_topology(default_topology_spec(trace.num_ranks, hw), trace.num_ranks));
}

CallTiming time_call(const Trace& trace, int call, const HardwareModel& hw, const std::vector<RankCompute>& compute,
                     const Topology& topology) {
  if (topology.num_ranks() != trace.num_ranks)
    throw Error(ErrorCode::kInvalidArgument, "sim timing: topology '" + topology.name + "' describes " +
                                                 std::to_string(topology.num_ranks()) + " ranks, the trace has " +
                                                 std::to_string(trace.num_ranks));
  {
    std::vector<int> per_frame;
    for (int r = 0; r < topology.num_ranks(); ++r) {
      const int f = topology.ranks[static_cast<std::size_t>(r)].frame;
      if (f >= hw.frames)
        throw Error(ErrorCode::kInvalidArgument, "sim timing: topology '" + topology.name + "' puts rank " + std::to_string(r) +
                                                     " in frame " + std::to_string(f) + ", hardware '" + hw.name + "' has " +
                                                     std::to_string(hw.frames) + " frames");
      if (per_frame.size() <= static_cast<std::size_t>(f)) per_frame.resize(static_cast<std::size_t>(f) + 1, 0);
      if (++per_frame[static_cast<std::size_t>(f)] > hw.ranks_per_frame)
        throw Error(ErrorCode::kInvalidArgument, "sim timing: topology '" + topology.name + "' puts more than " +
                                                     std::to_string(hw.ranks_per_frame) + " ranks in frame " + std::to_string(f) +
                                                     " (hardware '" + hw.name + "': " + std::to_string(hw.ranks_per_frame) +
                                                     " ranks per frame)");
    }
  }
  if (call < 0 || call >= static_cast<int>(trace.calls.size()))
    throw Error(ErrorCode::kInvalidArgument, "sim timing: no call " + std::to_string(call) + " in the trace");
  if (!compute.empty() && static_cast<int>(compute.size()) != trace.num_ranks)
    throw Error(ErrorCode::kInvalidArgument, "sim timing: compute must have one entry per rank");
  CallTimer timer(trace, call, hw, compute, topology);
  CallTiming t = timer.run();
  t.name = trace.calls[static_cast<std::size_t>(call)];
  return t;
}

}  // namespace epx::sim
