#include "analysis/verify_schedule.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/memory_plan.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"
#include "proto/roles.h"

namespace strata {
namespace {

std::string ActionName(const Action& a) {
  if (a.kind() == Action::FORWARD) return absl::StrCat("F", a.micro_batch());
  if (a.kind() == Action::BACKWARD) return absl::StrCat("B", a.micro_batch());
  return "OPT";
}

// One transfer or collective of a rank, pointing into its plan (which must
// outlive it): a layout of 1,024 ranks has millions.
struct Event {
  bool is_send;
  // A collective (an op with a group): blocks until every member of its
  // communicator has reached it. `comm` names the communicator: the lowest
  // id of the groups with the same members (they share one,
  // CommunicatorSet); `ordinal` counts the rank's earlier collectives on it.
  bool is_collective = false;
  int comm = -1;
  int ordinal = 0;
  int group = -1;
  const Channel* channel = nullptr;  // the send or recv op's, in the plan
  absl::string_view what;            // a collective's op type
  const Var* var = nullptr;  // the tensor sent, received or reduced, if the plan has it
  int micro_batch;
  const Action* action = nullptr;
  int action_index;  // in the rank's schedule
  // A recv after a send of its action (a tied weight's summed gradient coming
  // back for the part just sent) holds up the action's end, not its start; a
  // send after such a recv is posted at the action's end.
  bool late = false;

  TensorType type() const { return var != nullptr ? TypeOf(*var) : TensorType{}; }
  std::string action_name() const { return ActionName(*action); }  // "F3", "B0", "OPT"
};

std::string ChannelName(const Channel& c) {
  return absl::StrCat("channel ", c.id(), " '", c.var(), "' ", c.src_rank(), "->", c.dst_rank());
}

bool SameMembers(const CommGroup& a, const CommGroup& b) {
  return a.rank_size() == b.rank_size() && std::equal(a.rank().begin(), a.rank().end(), b.rank().begin());
}

// The communicator that serves each group of a plan: the lowest id among
// the plan's groups with the group's members. Every member of a group lists
// every group it belongs to (Mesh::GroupsOf), so its members agree on it.
// (A key by id, not by the member list: a world of 4,096 ranks made every
// collective's key 20 KB, and checking such a layout took minutes.)
absl::flat_hash_map<int, int> CommunicatorIds(const RankPlan& plan) {
  absl::flat_hash_map<int, int> comm;
  const auto& groups = plan.topology().group();
  for (const CommGroup& g : groups) {
    int lowest = g.id();
    for (const CommGroup& h : groups) {
      if (h.id() < lowest && SameMembers(g, h)) lowest = h.id();
    }
    comm.emplace(g.id(), lowest);
  }
  return comm;
}

// The transfers a rank performs, in order, and with `collectives` its
// collectives among them.
std::vector<Event> Events(const RankPlan& plan, bool collectives = false) {
  const Program& p = plan.program();
  // Only send/recv ops (and collectives) matter; most programs (one rank)
  // have none, so their vars are looked up by name only when there are some.
  std::vector<int> transfer_ops;
  for (int i = 0; i < p.op_size(); ++i) {
    const std::string& type = p.op(i).type();
    if (type == "send" || type == "recv" || (collectives && p.op(i).has_group())) transfer_ops.push_back(i);
  }
  std::vector<Event> events;
  if (transfer_ops.empty()) return events;
  absl::flat_hash_map<absl::string_view, const Var*> vars;
  for (int i : transfer_ops) {
    const Op& op = p.op(i);
    if (op.type() == "recv" ? op.output_size() > 0 : op.input_size() > 0) {
      vars.emplace(op.type() == "recv" ? op.output(0) : op.input(0), nullptr);
    }
  }
  for (const Var& v : p.var()) {
    auto it = vars.find(v.name());
    if (it != vars.end() && it->second == nullptr) it->second = &v;
  }
  // Once-per-update ops (gradient buckets) act in the last micro-batch's
  // backward only, or in the optimizer action where they run there.
  std::vector<bool> once(p.op_size(), false);
  for (int i : transfer_ops) {
    const OpSchema* schema = OpRegistry::Global().Find(p.op(i).type());
    once[i] = schema != nullptr && schema->once_per_update;
  }
  const int last_micro_batch = std::max(1, plan.schedule().micro_batches()) - 1;
  const absl::flat_hash_map<int, int> comm_of = collectives ? CommunicatorIds(plan) : absl::flat_hash_map<int, int>{};
  absl::flat_hash_map<int, int> ordinals;  // communicator -> collectives entered so far
  for (int ai = 0; ai < plan.schedule().action_size(); ++ai) {
    const Action& a = plan.schedule().action(ai);
    bool sent = false, received_late = false;
    for (int i : transfer_ops) {
      const Op& op = p.op(i);
      if (!ActionRuns(a.kind(), op.role())) continue;
      if (once[i] && a.kind() != Action::OPTIMIZE &&
          !(a.kind() == Action::BACKWARD && a.micro_batch() == last_micro_batch)) {
        continue;
      }
      Event e;
      if (op.has_group()) {
        e.is_send = false;
        e.is_collective = true;
        e.group = op.group();
        // A group the plan does not list gets a communicator no group has
        // (-1 - id), which VerifyCollectives refuses.
        auto c = comm_of.find(op.group());
        e.comm = c != comm_of.end() ? c->second : -1 - op.group();
        e.ordinal = ordinals[e.comm]++;
        auto v = op.input_size() > 0 ? vars.find(op.input(0)) : vars.end();
        e.var = v != vars.end() ? v->second : nullptr;
        e.what = op.type();  // for messages: what the rank enters
        e.micro_batch = a.kind() == Action::OPTIMIZE ? 0 : a.micro_batch();
        e.action = &a;
        e.action_index = ai;
        events.push_back(std::move(e));
        continue;
      }
      e.is_send = op.type() == "send";
      e.late = e.is_send ? received_late : sent;
      sent |= e.is_send;
      received_late |= !e.is_send && e.late;
      e.channel = &op.channel();
      const Var* v = vars.at(e.is_send ? op.input(0) : op.output(0));
      e.var = v;
      e.micro_batch = a.kind() == Action::OPTIMIZE ? 0 : a.micro_batch();
      e.action = &a;
      e.action_index = ai;
      events.push_back(std::move(e));
    }
  }
  return events;
}

// "group 1 (pp: ranks 0, 1)"; with `also`, the other groups that share its communicator.
std::string DescribeGroup(const CommGroup& g, const std::set<int>& also = {}) {
  std::string out = absl::StrCat("group ", g.id(), " (", absl::StrJoin(g.axis(), ","), ": ranks ",
                                 absl::StrJoin(g.rank(), ", "), ")");
  std::vector<int> others;
  for (int id : also) {
    if (id != g.id()) others.push_back(id);
  }
  if (!others.empty()) absl::StrAppend(&out, ", whose communicator also serves group ", absl::StrJoin(others, ", "), ",");
  return out;
}

// The groups of every plan, by id as each records it, and by communicator.
struct Groups {
  std::map<int, const CommGroup*> by_id;
  std::map<int, std::set<int>> ids_of;  // communicator (Event::comm) -> the groups it serves
  // The members of a communicator.
  const CommGroup& members(int comm) const { return *by_id.at(comm); }
};

Groups CollectGroups(const std::vector<RankPlan>& plans) {
  Groups groups;
  for (const RankPlan& plan : plans) {
    const absl::flat_hash_map<int, int> comm_of = CommunicatorIds(plan);
    for (const CommGroup& g : plan.topology().group()) {
      if (!groups.by_id.emplace(g.id(), &g).second) continue;  // (every member lists it alike)
      groups.ids_of[comm_of.at(g.id())].insert(g.id());
    }
  }
  return groups;
}

// "allreduce F64[]"
std::string CollectiveName(const Event& e) { return absl::StrCat(e.what, " ", e.type().ToString()); }

// Every communicator's members must enter the same collectives in the same
// order, or one waits forever in a collective another never joins (or joins
// with another tensor). Groups with the same members share a communicator,
// so their collectives form one sequence.
absl::Status VerifyCollectives(const std::vector<RankPlan>& plans, const std::vector<std::vector<Event>>& events,
                               const Groups& groups) {
  std::map<int, std::map<int, std::vector<const Event*>>> entered;  // comm -> rank -> in order
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const Event& e : events[r]) {
      if (!e.is_collective) continue;
      if (!groups.by_id.count(e.group)) {
        return absl::InvalidArgumentError(
            absl::StrCat("schedule: rank ", r, " enters a collective of group ", e.group, ", which no plan has"));
      }
      entered[e.comm][static_cast<int>(r)].push_back(&e);
    }
  }
  for (const auto& [comm, by_rank] : entered) {
    if (comm < 0 || !groups.ids_of.count(comm)) {
      const Event& e = *by_rank.begin()->second.front();
      return absl::InvalidArgumentError(absl::StrCat("schedule: rank ", by_rank.begin()->first,
                                                     " enters a collective of a group its plan does not list (",
                                                     DescribeGroup(*groups.by_id.at(e.group)), ")"));
    }
    // Only members enter (a rank that is not one would be counted as one).
    const auto& members = groups.members(comm).rank();
    for (const auto& [r, s] : by_rank) {
      if (std::find(members.begin(), members.end(), r) == members.end()) {
        return absl::InvalidArgumentError(absl::StrCat("schedule: rank ", r, " enters a collective of ",
                                                       DescribeGroup(*groups.by_id.at(s.front()->group)),
                                                       ", which it is not a member of"));
      }
    }
    // The groups these collectives are of (one, unless groups with the same
    // members both have some): messages name them.
    std::set<int> ids;
    for (const auto& [r, s] : by_rank) {
      for (const Event* e : s) ids.insert(e->group);
    }
    const bool shared = ids.size() > 1;
    auto sequence = [shared](const std::vector<const Event*>& s) {
      if (s.empty()) return std::string("none");
      std::vector<std::string> items;
      for (const Event* e : s) {
        items.push_back(absl::StrCat(CollectiveName(*e), " (", e->action_name(), shared ? absl::StrCat(", group ", e->group) : "", ")"));
      }
      return absl::StrJoin(items, ", ");
    };
    const CommGroup& group = *groups.by_id.at(*ids.begin());
    const std::vector<const Event*> none;
    const int first = group.rank(0);
    const std::vector<const Event*>& reference = by_rank.count(first) ? by_rank.at(first) : none;
    for (int r : group.rank()) {
      const std::vector<const Event*>& mine = by_rank.count(r) ? by_rank.at(r) : none;
      bool same = mine.size() == reference.size();
      // Groups that share a communicator must also agree on which group each
      // collective is of, or one group's tensor is reduced with another's.
      for (size_t k = 0; same && k < mine.size(); ++k) {
        same = CollectiveName(*mine[k]) == CollectiveName(*reference[k]) && mine[k]->group == reference[k]->group;
      }
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat("schedule would hang: the ranks of ", DescribeGroup(group, ids),
                                                       " enter different collectives: rank ", first, ": ",
                                                       sequence(reference), "; rank ", r, ": ", sequence(mine)));
      }
    }
  }
  return absl::OkStatus();
}

// Runs `advance` on every rank (or on `start`'s), then again on the ranks
// `wakes` lists for each rank that moved (advance returned true), until none
// is left: each rank runs as far as its receives and collectives allow, and
// only the ranks it sends to or shares a communicator with can move after it.
// (Sweeping every rank until none moved took a sweep per hop of a backward
// pass: stages x micro-batches sweeps of every rank.) The ranks' progress
// only grows, so where they stop does not depend on the order. Stops at
// advance's first error. `wakes` may hold duplicates and the rank itself.
absl::Status AdvanceUntilStuck(const std::vector<std::vector<int>>& wakes,
                               const std::function<absl::StatusOr<bool>(int)>& advance,
                               const std::vector<int>* start = nullptr) {
  const int n = static_cast<int>(wakes.size());
  std::deque<int> work;
  std::vector<bool> queued(n, false);
  auto push = [&](int q) {
    if (q >= 0 && q < n && !queued[q]) {
      queued[q] = true;
      work.push_back(q);
    }
  };
  if (start == nullptr) {
    for (int r = 0; r < n; ++r) push(r);
  } else {
    for (int r : *start) push(r);
  }
  while (!work.empty()) {
    const int r = work.front();
    work.pop_front();
    queued[r] = false;
    absl::StatusOr<bool> moved = advance(r);
    if (!moved.ok()) return moved.status();
    if (!*moved) continue;
    for (int q : wakes[r]) {
      if (q != r) push(q);
    }
  }
  return absl::OkStatus();
}

// Sorts each rank's list and drops repeats.
std::vector<std::vector<int>> Deduplicated(std::vector<std::vector<int>> wakes) {
  for (std::vector<int>& w : wakes) {
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
  }
  return wakes;
}

}  // namespace

absl::Status VerifySchedules(const std::vector<RankPlan>& plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<std::vector<Event>> events(n);
  for (int r = 0; r < n; ++r) events[r] = Events(plans[r], /*collectives=*/true);
  const Groups groups = CollectGroups(plans);
  if (absl::Status s = VerifyCollectives(plans, events, groups); !s.ok()) return s;
  for (int r = 0; r < n; ++r) {
    for (const Event& e : events[r]) {
      if (e.is_collective) continue;
      int self = e.is_send ? e.channel->src_rank() : e.channel->dst_rank();
      int peer = e.is_send ? e.channel->dst_rank() : e.channel->src_rank();
      if (self != r || peer < 0 || peer >= n || peer == r) {
        return absl::InvalidArgumentError(absl::StrCat("schedule: rank ", r, " ", e.action_name(), ": ", ChannelName(*e.channel),
                                                       " does not connect this rank to another of the ", n, " ranks"));
      }
    }
  }

  // Every rank's transfers and collectives run together: a send is posted and
  // the rank goes on, a recv waits for its send, a collective for every
  // member of its communicator to reach it.
  // Posted sends not yet received: (channel id, micro-batch) -> send event.
  std::map<std::pair<int64_t, int>, const Event*> in_flight;
  // (communicator, rank) -> how many of its collectives on it the rank has reached.
  absl::flat_hash_map<std::pair<int, int>, int> reached;
  // (communicator, ordinal) -> how many members have reached that collective.
  absl::flat_hash_map<std::pair<int, int>, int> arrived;
  // The first member of e's communicator that has not yet reached it, or -1.
  auto missing = [&](const Event& e) {
    for (int m : groups.members(e.comm).rank()) {
      auto it = reached.find({e.comm, m});
      if (it == reached.end() || it->second <= e.ordinal) return m;
    }
    return -1;
  };
  // The ranks whose waits a rank's progress can end: those it sends to and
  // its communicators' members.
  std::vector<std::vector<int>> wakes(n);
  for (int r = 0; r < n; ++r) {
    std::set<int> comms;
    for (const Event& e : events[r]) {
      if (e.is_collective) {
        comms.insert(e.comm);
      } else if (e.is_send) {
        wakes[r].push_back(static_cast<int>(e.channel->dst_rank()));
      }
    }
    for (int comm : comms) {
      for (int m : groups.members(comm).rank()) wakes[r].push_back(m);
    }
  }
  std::vector<size_t> next(n, 0);
  auto advance = [&](int r) -> absl::StatusOr<bool> {
    bool progress = false;
    while (next[r] < events[r].size()) {
      const Event& e = events[r][next[r]];
      if (e.is_collective) {
        int& mine = reached[{e.comm, r}];
        if (mine <= e.ordinal) {
          mine = e.ordinal + 1;
          ++arrived[{e.comm, e.ordinal}];
          progress = true;
        }
        if (arrived[{e.comm, e.ordinal}] < groups.members(e.comm).rank_size()) break;  // blocked
      } else if (const std::pair<int64_t, int> key{e.channel->id(), e.micro_batch}; e.is_send) {
        if (in_flight.count(key)) {
          return absl::InvalidArgumentError(absl::StrCat("schedule: rank ", r, " ", e.action_name(), " sends ",
                                                         ChannelName(*e.channel), " micro-batch ", e.micro_batch,
                                                         " twice before it is received"));
        }
        in_flight[key] = &e;
      } else {
        auto it = in_flight.find(key);
        if (it == in_flight.end()) break;  // blocked
        const Event& s = *it->second;
        if (s.type() != e.type()) {
          return absl::InvalidArgumentError(absl::StrCat("schedule: ", ChannelName(*e.channel), ": rank ", s.channel->src_rank(),
                                                         " sends ", s.type().ToString(), " in ", s.action_name(), " but rank ", r,
                                                         " receives ", e.type().ToString(), " in ", e.action_name()));
        }
        in_flight.erase(it);
      }
      ++next[r];
      progress = true;
    }
    return progress;
  };
  if (absl::Status s = AdvanceUntilStuck(Deduplicated(std::move(wakes)), advance); !s.ok()) return s;
  bool done = true;
  for (int r = 0; r < n; ++r) done &= next[r] == events[r].size();
  if (!done) {
    // Every unfinished rank waits, on a recv or in a collective: follow who
    // waits for whom.
    std::vector<std::string> waits;
    std::set<int> visited;
    int r = 0;
    while (next[r] == events[r].size()) ++r;
    while (r >= 0 && !visited.count(r)) {
      visited.insert(r);
      if (next[r] == events[r].size()) {
        waits.push_back(absl::StrCat("rank ", r, " has finished"));
        break;
      }
      const Event& e = events[r][next[r]];
      if (e.is_collective) {
        const int m = missing(e);
        waits.push_back(absl::StrCat("rank ", r, " in ", e.action_name(), " waits in ", CollectiveName(e), " over ",
                                     DescribeGroup(*groups.by_id.at(e.group)), " for rank ", m));
        r = m;
        continue;
      }
      waits.push_back(absl::StrCat("rank ", r, " in ", e.action_name(), " waits to receive ", ChannelName(*e.channel),
                                   " micro-batch ", e.micro_batch, " from rank ", e.channel->src_rank()));
      r = e.channel->src_rank();
    }
    return absl::InvalidArgumentError(absl::StrCat("schedule would hang: ", absl::StrJoin(waits, "; ")));
  }
  if (!in_flight.empty()) {
    const Event& s = *in_flight.begin()->second;
    return absl::InvalidArgumentError(absl::StrCat("schedule: rank ", s.channel->src_rank(), " ", s.action_name(), " sends ",
                                                   ChannelName(*s.channel), " micro-batch ", s.micro_batch,
                                                   " but no rank receives it"));
  }
  // NCCL matches the messages from one rank to another by the order they
  // are issued, not by tag (runtime/comm/nccl_communicator.h): on a GPU
  // plan a rank must receive from a peer in the order the peer sends to it.
  // (Gloo matches by tag, so CPU plans need not.)
  bool gpu = false;
  for (const RankPlan& plan : plans) gpu = gpu || plan.device_kind() == DEVICE_CUDA;
  if (!gpu) return absl::OkStatus();
  std::map<std::pair<int, int>, std::vector<const Event*>> sent, received;  // (src, dst) -> in issue order
  for (int r = 0; r < n; ++r) {
    for (const Event& e : events[r]) {
      if (e.is_collective) continue;
      (e.is_send ? sent : received)[{e.channel->src_rank(), e.channel->dst_rank()}].push_back(&e);
    }
  }
  // Sends go as their ops run; an action posts its receives when it starts,
  // in channel order (Executor::Prepare).
  for (auto& [pair, recvs] : received) {
    std::stable_sort(recvs.begin(), recvs.end(), [](const Event* a, const Event* b) {
      return std::make_pair(a->action_index, a->channel->id()) < std::make_pair(b->action_index, b->channel->id());
    });
  }
  for (const auto& [pair, sends] : sent) {
    const std::vector<const Event*>& recvs = received[pair];
    for (size_t i = 0; i < sends.size() && i < recvs.size(); ++i) {
      const Event& s = *sends[i];
      const Event& r = *recvs[i];
      if (s.channel->id() == r.channel->id() && s.micro_batch == r.micro_batch) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule: rank ", pair.first, "'s message ", i + 1, " to rank ", pair.second, " is ", ChannelName(*s.channel),
          " micro-batch ", s.micro_batch, " (", s.action_name(), "), but rank ", pair.second, "'s receive ", i + 1,
          " from it is ", ChannelName(*r.channel), " micro-batch ", r.micro_batch, " (", r.action_name(),
          "): NCCL matches a pair's messages in the order they are issued"));
    }
  }
  return absl::OkStatus();
}

Timeline SimulateTimeline(const std::vector<RankPlan>& plans, double forward_cost, double backward_cost) {
  return SimulateTimeline(plans, std::vector<std::pair<double, double>>(plans.size(), {forward_cost, backward_cost}));
}

Timeline SimulateTimeline(const std::vector<RankPlan>& plans, const std::vector<std::pair<double, double>>& costs) {
  const int n = static_cast<int>(plans.size());
  Timeline t;
  t.ranks.resize(n);
  // Which action of which rank sends each (channel, micro-batch), and whether
  // it posts the send at the action's end rather than when its work is done.
  struct Sender {
    int rank, action;
    bool late;
  };
  absl::flat_hash_map<std::pair<int64_t, int>, Sender> sender;
  // rank -> action -> the keys it receives before its work, and after a send of its own.
  struct Receives {
    std::vector<std::pair<int64_t, int>> before, after;
  };
  std::vector<std::vector<Receives>> receives(n);
  // The ranks each rank sends to: the only ones its progress can unblock.
  std::vector<std::vector<int>> receivers(n);
  for (int r = 0; r < n; ++r) {
    receives[r].resize(plans[r].schedule().action_size());
    for (const Event& e : Events(plans[r])) {
      auto key = std::make_pair(e.channel->id(), e.micro_batch);
      if (e.is_send) {
        sender[key] = {r, e.action_index, e.late};
        receivers[r].push_back(static_cast<int>(e.channel->dst_rank()));
      } else {
        (e.late ? receives[r][e.action_index].after : receives[r][e.action_index].before).push_back(key);
      }
    }
    for (const Action& a : plans[r].schedule().action()) t.ranks[r].push_back({a, -1, -1, -1});
  }
  // Raises `time` to when every key has been sent; false while one is not yet.
  auto arrived = [&](const std::vector<std::pair<int64_t, int>>& keys, double* time) {
    for (const auto& key : keys) {
      auto s = sender.find(key);
      if (s == sender.end()) continue;
      const Timeline::Slot& slot = t.ranks[s->second.rank][s->second.action];
      const double posted = s->second.late ? slot.end : slot.work_end;
      if (posted < 0) return false;
      *time = std::max(*time, posted);
    }
    return true;
  };
  std::vector<int> next(n, 0);
  std::vector<bool> working(n, false);  // next[r] has started and waits to receive after its sends
  std::vector<double> free_at(n, 0);
  // Each rank runs its actions in order as far as their receives allow. The
  // times are the dependencies' and so do not depend on the visiting order.
  (void)AdvanceUntilStuck(Deduplicated(std::move(receivers)), [&](int r) -> absl::StatusOr<bool> {
    bool progress = false;
    while (next[r] < static_cast<int>(t.ranks[r].size())) {
      Timeline::Slot& slot = t.ranks[r][next[r]];
      const Receives& in = receives[r][next[r]];
      if (!working[r]) {
        double ready = free_at[r];
        if (!arrived(in.before, &ready)) break;
        const double cost = slot.action.kind() == Action::FORWARD ? costs[r].first
                            : slot.action.kind() == Action::BACKWARD ? costs[r].second : 0;
        slot.start = ready;
        slot.work_end = ready + cost;
        working[r] = true;
        progress = true;
      }
      double done = slot.work_end;
      if (!arrived(in.after, &done)) break;
      slot.end = done;
      free_at[r] = done;
      working[r] = false;
      ++next[r];
      progress = true;
    }
    return progress;
  });
  for (int r = 0; r < n; ++r) t.makespan = std::max(t.makespan, free_at[r]);
  for (int r = 0; r < n; ++r) {
    double busy = 0;
    for (const auto& slot : t.ranks[r]) busy += std::max(0.0, slot.work_end - slot.start);
    t.bubble.push_back(t.makespan > 0 ? 1.0 - busy / t.makespan : 0.0);
  }
  return t;
}

std::string Timeline::Diagram() const {
  std::string out;
  const int width = static_cast<int>(makespan + 0.5);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string row(width, '.');
    for (const Slot& s : ranks[r]) {
      if (s.action.kind() == Action::OPTIMIZE) continue;
      const int mb = s.action.micro_batch();
      char c = s.action.kind() == Action::FORWARD ? (mb < 10 ? static_cast<char>('0' + mb) : '+')
                                                  : (mb < 26 ? static_cast<char>('a' + mb) : '*');
      for (int x = static_cast<int>(s.start + 0.5); x < static_cast<int>(s.work_end + 0.5) && x < width; ++x) row[x] = c;
    }
    absl::StrAppend(&out, "rank ", r, " |", row, "|\n");
  }
  return out;
}

std::map<std::pair<int64_t, int>, int> SendReleaseActions(const std::vector<RankPlan>& plans, const Timeline& timeline,
                                                          int rank) {
  const std::vector<Event> events = Events(plans[rank]);
  // Only the ranks this one sends to: reading every rank's events for each
  // rank made the compile quadratic in the ranks.
  std::set<int> receivers;
  for (const Event& e : events) {
    if (e.is_send) receivers.insert(e.channel->dst_rank());
  }
  // (channel, mb) -> when the receiver takes it: at its action's start, or after its work for a late recv.
  std::map<std::pair<int64_t, int>, double> taken_at;
  for (int q : receivers) {
    for (const Event& e : Events(plans[q])) {
      if (e.is_send || e.channel->src_rank() != rank) continue;
      const Timeline::Slot& slot = timeline.ranks[q][e.action_index];
      taken_at[{e.channel->id(), e.micro_batch}] = e.late ? slot.work_end : slot.start;
    }
  }
  std::map<std::pair<int64_t, int>, int> out;
  const auto& mine = timeline.ranks[rank];
  for (const Event& e : events) {
    if (!e.is_send) continue;
    auto key = std::make_pair(e.channel->id(), e.micro_batch);
    auto r = taken_at.find(key);
    if (r == taken_at.end()) continue;
    const double taken = r->second;
    int i = e.action_index;
    while (i + 1 < static_cast<int>(mine.size()) && mine[i].end < taken) ++i;
    out[key] = i;
  }
  return out;
}

absl::Status DeferDeadlockingSendWaits(const std::vector<RankPlan>& plans,
                                       std::vector<std::map<std::pair<int64_t, int>, int>>* releases) {
  const int n = static_cast<int>(plans.size());
  if (static_cast<int>(releases->size()) != n) {
    return absl::InternalError(absl::StrCat("send waits: ", releases->size(), " release maps for ", n, " ranks"));
  }
  using Key = std::pair<int64_t, int>;
  struct Transfer {
    Key key;
    bool is_send;
  };
  // Per rank and action: its transfers in program order and the sends waited
  // for at its end.
  struct Rank {
    std::vector<Transfer> transfers;
    std::vector<int> first;  // action -> its transfers [first[a], first[a + 1])
    std::vector<std::vector<Key>> waits;
    int action = 0;
    int phase = 0;  // 0: post the action's receives, 1: its transfers, 2: its waits
    int index = 0;  // within the phase
  };
  std::vector<Rank> ranks(n);
  // A rank's progress can end the waits of the ranks it sends to (a receive
  // of what it sent) and receives from (a send waiting for its receive to be
  // posted).
  std::vector<std::vector<int>> wakes(n);
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks[r];
    const int actions = plans[r].schedule().action_size();
    rank.first.assign(actions + 1, 0);
    rank.waits.resize(actions);
    for (const Event& e : Events(plans[r])) {
      const Key key{e.channel->id(), e.micro_batch};
      wakes[r].push_back(static_cast<int>(e.is_send ? e.channel->dst_rank() : e.channel->src_rank()));
      rank.transfers.push_back({key, e.is_send});
      ++rank.first[e.action_index + 1];
      if (!e.is_send) continue;
      auto it = (*releases)[r].find(key);
      const int at = it == (*releases)[r].end() ? actions - 1 : std::min(std::max(e.action_index, it->second), actions - 1);
      (*releases)[r][key] = at;
      rank.waits[at].push_back(key);
    }
    for (int a = 0; a < actions; ++a) rank.first[a + 1] += rank.first[a];
  }
  // Sends posted and not yet received, receives posted and not yet waited for.
  absl::flat_hash_set<Key> sent, posted;
  // Runs a rank as far as it goes; true if it moved.
  auto advance = [&](int r) -> absl::StatusOr<bool> {
    Rank& rank = ranks[r];
    bool moved = false;
    while (rank.action < static_cast<int>(rank.waits.size())) {
      const int first = rank.first[rank.action], last = rank.first[rank.action + 1];
      if (rank.phase == 0) {
        for (int i = first; i < last; ++i) {
          if (!rank.transfers[i].is_send) posted.insert(rank.transfers[i].key);
        }
        rank.phase = 1;
        rank.index = first;
      } else if (rank.phase == 1) {
        if (rank.index == last) {
          rank.phase = 2;
          rank.index = 0;
          continue;
        }
        const Transfer& t = rank.transfers[rank.index];
        if (t.is_send) {
          sent.insert(t.key);
        } else if (sent.erase(t.key) == 0) {
          break;
        }
        ++rank.index;
      } else {
        const std::vector<Key>& waits = rank.waits[rank.action];
        if (rank.index == static_cast<int>(waits.size())) {
          ++rank.action;
          rank.phase = 0;
          continue;
        }
        if (posted.erase(waits[rank.index]) == 0) break;
        ++rank.index;
      }
      moved = true;
    }
    return moved;
  };
  wakes = Deduplicated(std::move(wakes));
  std::vector<int> start(n);  // every rank first, then the one deferred
  std::iota(start.begin(), start.end(), 0);
  while (true) {
    if (absl::Status s = AdvanceUntilStuck(wakes, advance, &start); !s.ok()) return s;
    // Stuck (or done): the first rank waiting on a send before its last
    // action waits for it one action later instead, and the ranks go on.
    bool done = true, deferred = false;
    for (int r = 0; r < n && !deferred; ++r) {
      Rank& rank = ranks[r];
      if (rank.action == static_cast<int>(rank.waits.size())) continue;
      done = false;
      if (rank.phase != 2 || rank.action + 1 == static_cast<int>(rank.waits.size())) continue;
      std::vector<Key>& waits = rank.waits[rank.action];
      const Key key = waits[rank.index];
      waits.erase(waits.begin() + rank.index);
      rank.waits[rank.action + 1].push_back(key);
      (*releases)[r][key] = rank.action + 1;
      deferred = true;
      start = {r};
    }
    if (done) return absl::OkStatus();
    if (!deferred) return absl::InternalError("send waits: the ranks would wait on one another forever");
  }
}

}  // namespace strata
