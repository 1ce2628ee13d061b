#include "compiler/graph_index.h"

#include <memory>
#include <string>
#include <vector>

#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;

Program Parse(const std::string& text) {
  auto p = ParseProgramText(text, "test.pbtxt");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Program();
}

// clang-format off
constexpr char kProgram[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM }
  var { name: "h" dtype: F32 shape: [-1, 3] kind: ACTIVATION }
  var { name: "r" dtype: F32 shape: [-1, 3] kind: ACTIVATION }
  op { type: "matmul" input: ["x", "w"] output: ["h"] }
  op { type: "relu" input: ["h"] output: ["r"] }
  op { type: "add" input: ["r", "h"] output: ["s"] }
)pb";
// clang-format on

// kProgram with 's' declared last, so the var ids match the order of first use.
Program ProgramDeclaringS() {
  Program p = Parse(kProgram);
  Var* s = p.add_var();
  s->set_name("s");
  s->set_dtype(F32);
  s->add_shape(-1);
  s->add_shape(3);
  return p;
}

// Everything the index answers, as one comparable string.
std::string Dump(const GraphIndex& index) {
  std::string out;
  for (int id = 0; id < index.num_ids(); ++id) {
    out += std::string(index.name(id)) + ":" + (index.declared(id) ? index.type(id).ToString() : "undeclared") + ":" +
           std::to_string(index.producer(id)) + ":" + std::to_string(static_cast<int>(index.kind(id))) + " ";
  }
  for (int i = 0; i < index.num_ops(); ++i) {
    out += "|";
    for (int id : index.input_ids(i)) out += std::to_string(id) + ",";
    out += ">";
    for (int id : index.output_ids(i)) out += std::to_string(id) + ",";
  }
  return out;
}

TEST(GraphIndexTest, NumbersDeclaredVarsFirstThenUndeclaredNames) {
  const Program p = Parse(kProgram);
  GraphIndex index(p);
  EXPECT_EQ(index.num_ids(), 5);
  EXPECT_EQ(index.id("x"), 0);
  EXPECT_EQ(index.id("r"), 3);
  EXPECT_EQ(index.id("s"), 4);  // written, never declared
  EXPECT_EQ(index.id("nowhere"), -1);
  EXPECT_EQ(index.name(4), "s");
  EXPECT_FALSE(index.declared(4));
  EXPECT_EQ(index.var(4), nullptr);
  EXPECT_EQ(index.var("w"), &p.var(1));
  EXPECT_EQ(index.producer("h"), 0);
  EXPECT_EQ(index.producer("w"), -1);
  EXPECT_THAT(index.consumers("h"), ElementsAre(1, 2));
  EXPECT_THAT(index.input_ids(2), ElementsAre(3, 2));
  EXPECT_EQ(index.kind(1), PARAM);
  EXPECT_EQ(index.type(1).ToString(), "F32[4, 3]");
  EXPECT_TRUE(index.HasType(2, TensorType{F32, {-1, 3}}));
  EXPECT_FALSE(index.HasType(2, TensorType{F32, {-1, 4}}));
  EXPECT_FALSE(index.HasType(4, TensorType{F32, {-1, 3}}));
}

TEST(GraphIndexTest, FindsEveryNameAmongThousands) {
  Program p;
  for (int i = 0; i < 5000; ++i) {
    Var* v = p.add_var();
    v->set_name("v" + std::to_string(i));
    v->set_dtype(F32);
    v->add_shape(i % 7 + 1);
  }
  GraphIndex index(p);
  ASSERT_EQ(index.num_ids(), 5000);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(index.id("v" + std::to_string(i)), i);
    ASSERT_EQ(index.type(i).shape[0], i % 7 + 1);
  }
  EXPECT_EQ(index.id("v5000"), -1);
}

TEST(GraphIndexTest, ExtendsThePreviousIndexAfterAnAppend) {
  Program p = ProgramDeclaringS();
  GraphIndex before(p);
  Var* t = p.add_var();
  t->set_name("t");
  t->set_dtype(F32);
  Op* op = p.add_op();
  op->set_type("relu");
  op->add_input("s");
  op->add_output("t");
  GraphIndex extended(p, &before);
  GraphIndex fresh(p);
  EXPECT_EQ(Dump(extended), Dump(fresh));
  EXPECT_EQ(extended.id("t"), 5);
  EXPECT_EQ(extended.producer("t"), 3);
}

TEST(GraphIndexTest, ResolvesRenamedOpsAndReorderedVarsAsAFreshIndexWould) {
  Program p = ProgramDeclaringS();
  GraphIndex before(p);
  // An op now reads another var, and one gains an input: each is resolved anew.
  p.mutable_op(2)->set_input(1, "x");
  p.mutable_op(1)->add_input("w");
  GraphIndex renamed(p, &before);
  EXPECT_EQ(Dump(renamed), Dump(GraphIndex(p)));
  EXPECT_THAT(renamed.consumers("x"), ElementsAre(0, 2));

  // Vars swapped or removed: the previous numbering no longer holds.
  p.mutable_var()->SwapElements(0, 1);
  GraphIndex swapped(p, &renamed);
  EXPECT_EQ(Dump(swapped), Dump(GraphIndex(p)));
  EXPECT_EQ(swapped.id("w"), 0);
  p.mutable_var()->RemoveLast();
  GraphIndex removed(p, &swapped);
  EXPECT_EQ(Dump(removed), Dump(GraphIndex(p)));
  EXPECT_FALSE(removed.declared(removed.id("s")));
}

TEST(GraphIndexTest, VerifierWithThePreviousIndexStillChecksEveryOp) {
  Program p = ProgramDeclaringS();
  auto index = VerifyAndIndexProgram(p);
  ASSERT_TRUE(index.ok()) << index.status();
  // An old op changed in place: its new input is checked, not taken on trust.
  p.mutable_op(1)->set_input(0, "s");
  auto again = VerifyAndIndexProgram(p, index->get());
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), ::testing::HasSubstr("input 's' used before definition"));
  // And a type recorded wrongly on an old var.
  p.mutable_op(1)->set_input(0, "h");
  p.mutable_var(3)->set_shape(1, 5);
  again = VerifyAndIndexProgram(p, index->get());
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), ::testing::HasSubstr("output 'r' is recorded as F32[-1, 5]"));
}

// A randomized differential check: GraphIndex(program, &previous) must answer
// exactly as GraphIndex(program) for any previous index, whether of the same
// program before an edit (vars and ops appended, removed, reordered, renamed,
// arity changed, duplicates, undeclared names) or of an unrelated one.
class Rand {
 public:
  explicit Rand(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
  bool Chance(int percent) { return Below(100) < percent; }

 private:
  uint64_t s_;
};

std::string RandomName(Rand& r, int pool) {
  // A small pool, so names collide; "" and a prefix of another included.
  const int k = r.Below(pool);
  if (k == 0) return "";
  if (k == 1) return "n";
  return "n" + std::to_string(k);
}

void AddRandomVar(Program& p, Rand& r, const std::string& name) {
  Var* v = p.add_var();
  v->set_name(name);
  const DataType dtypes[] = {F32, F64, I64, I32, BOOL};
  v->set_dtype(dtypes[r.Below(5)]);
  const VarKind kinds[] = {FEED, PARAM, ACTIVATION, STATE};
  v->set_kind(kinds[r.Below(4)]);
  const int rank = r.Below(4);
  for (int d = 0; d < rank; ++d) v->add_shape(r.Below(5) - 1);
}

void AddRandomOp(Program& p, Rand& r, int pool, int at = -1) {
  Op op;
  op.set_type("relu");
  const int ins = r.Below(4), outs = r.Below(3);
  for (int k = 0; k < ins; ++k) op.add_input(RandomName(r, pool));
  for (int k = 0; k < outs; ++k) op.add_output(RandomName(r, pool));
  *p.add_op() = op;
  if (at >= 0) {
    for (int i = p.op_size() - 1; i > at; --i) p.mutable_op()->SwapElements(i, i - 1);
  }
}

// A program whose op names are mostly declared vars.
Program RandomProgram(Rand& r, int pool) {
  Program p;
  const int vars = r.Below(pool + 2);
  for (int j = 0; j < vars; ++j) AddRandomVar(p, r, RandomName(r, pool));
  if (r.Chance(50)) {  // every name of the pool declared, in a random order, so StartFrom can succeed
    p.clear_var();
    std::vector<int> order(pool);
    for (int k = 0; k < pool; ++k) order[k] = k;
    for (int k = pool - 1; k > 0; --k) std::swap(order[k], order[r.Below(k + 1)]);
    const int keep = 1 + r.Below(pool);
    for (int k = 0; k < keep; ++k)
      AddRandomVar(p, r, order[k] == 0 ? "" : order[k] == 1 ? "n" : "n" + std::to_string(order[k]));
  }
  const int ops = r.Below(8);
  // Ops drawn from the declared names only (when there are any) most of the time.
  for (int i = 0; i < ops; ++i) {
    Op* op = p.add_op();
    op->set_type("relu");
    const int ins = r.Below(4), outs = r.Below(3);
    for (int k = 0; k < ins + outs; ++k) {
      std::string name = p.var_size() > 0 && r.Chance(90) ? p.var(r.Below(p.var_size())).name() : RandomName(r, pool);
      if (k < ins)
        op->add_input(name);
      else
        op->add_output(name);
    }
  }
  return p;
}

// One random edit of the kinds a pass makes, and a few it should not.
void Mutate(Program& p, Rand& r, int pool) {
  switch (r.Below(12)) {
    case 0:  // append vars (maybe duplicating an existing name)
      for (int n = r.Below(3) + 1; n > 0; --n) AddRandomVar(p, r, RandomName(r, pool + 3));
      break;
    case 1:  // append ops
      for (int n = r.Below(3) + 1; n > 0; --n) AddRandomOp(p, r, pool + 3);
      break;
    case 2:  // insert an op in the middle
      AddRandomOp(p, r, pool + 3, p.op_size() > 0 ? r.Below(p.op_size()) : -1);
      break;
    case 3:  // remove an op
      if (p.op_size() > 0) {
        p.mutable_op()->SwapElements(r.Below(p.op_size()), p.op_size() - 1);
        p.mutable_op()->RemoveLast();
      }
      break;
    case 4:  // swap two ops
      if (p.op_size() > 1) p.mutable_op()->SwapElements(r.Below(p.op_size()), r.Below(p.op_size()));
      break;
    case 5:  // rename an op's input or output
      if (p.op_size() > 0) {
        Op* op = p.mutable_op(r.Below(p.op_size()));
        if (op->input_size() > 0 && r.Chance(50))
          op->set_input(r.Below(op->input_size()), RandomName(r, pool + 3));
        else if (op->output_size() > 0)
          op->set_output(r.Below(op->output_size()), RandomName(r, pool + 3));
      }
      break;
    case 6:  // change an op's arity
      if (p.op_size() > 0) {
        Op* op = p.mutable_op(r.Below(p.op_size()));
        if (r.Chance(50))
          op->add_input(RandomName(r, pool + 3));
        else if (op->input_size() > 0)
          op->mutable_input()->RemoveLast();
        else
          op->add_output(RandomName(r, pool + 3));
      }
      break;
    case 7:  // remove a var
      if (p.var_size() > 0) {
        const int j = r.Below(p.var_size());
        for (int k = j; k + 1 < p.var_size(); ++k) p.mutable_var()->SwapElements(k, k + 1);
        p.mutable_var()->RemoveLast();
      }
      break;
    case 8:  // swap two vars
      if (p.var_size() > 1) p.mutable_var()->SwapElements(r.Below(p.var_size()), r.Below(p.var_size()));
      break;
    case 9:  // rename a var
      if (p.var_size() > 0) p.mutable_var(r.Below(p.var_size()))->set_name(RandomName(r, pool + 3));
      break;
    case 10:  // retype a var in place
      if (p.var_size() > 0) {
        Var* v = p.mutable_var(r.Below(p.var_size()));
        v->set_dtype(v->dtype() == F32 ? I64 : F32);
        v->add_shape(3);
        v->set_kind(v->kind() == PARAM ? ACTIVATION : PARAM);
      }
      break;
    case 11:  // declare a name ops use (appended)
      if (p.op_size() > 0 && p.op(0).input_size() > 0) AddRandomVar(p, r, p.op(0).input(0));
      break;
  }
}

// Dump plus what it leaves out: var pointers and consumer lists, by id and by name.
std::string FullDump(const GraphIndex& index, const Program& p) {
  std::string out = Dump(index);
  for (int id = 0; id < index.num_ids(); ++id) {
    const Var* v = index.var(id);
    int j = -1;
    for (int k = 0; k < p.var_size(); ++k) {
      if (&p.var(k) == v) j = k;
    }
    out += " v" + std::to_string(j) + "[";
    for (int c : index.consumers(id)) out += std::to_string(c) + ",";
    out += "]";
    if (index.id(index.name(id)) != id) out += " BADID";
    if (index.var(index.name(id)) != v || index.producer(index.name(id)) != index.producer(id)) out += " BADNAME";
  }
  return out;
}

TEST(GraphIndexTest, WithAnyPreviousIndexAnswersAsAFreshIndex) {
  int started_from = 0;
  for (int seed = 0; seed < 20000; ++seed) {
    Rand r(seed);
    const int pool = 2 + r.Below(6);
    Program before = r.Chance(10) ? Program() : RandomProgram(r, pool);
    auto previous = std::make_unique<GraphIndex>(before);
    Program now;
    if (r.Chance(15)) {
      now = RandomProgram(r, pool);  // unrelated
    } else {
      now = before;
      for (int n = r.Below(4) + (r.Chance(30) ? 0 : 1); n > 0; --n) Mutate(now, r, pool);
    }
    // Chains too: the previous index may itself have been built from an older one.
    std::unique_ptr<GraphIndex> older;
    if (r.Chance(30)) {
      Program oldest = before;
      Mutate(oldest, r, pool);
      older = std::make_unique<GraphIndex>(oldest);
      previous = std::make_unique<GraphIndex>(before, older.get());
      ASSERT_EQ(FullDump(*previous, before), FullDump(GraphIndex(before), before)) << "seed " << seed;
    }
    GraphIndex extended(now, previous.get());
    const bool all_declared = [&] {
      if (previous->num_ids() > now.var_size()) return false;
      for (int j = 0; j < previous->num_ids(); ++j) {
        if (!previous->declared(j) || now.var(j).name() != previous->name(j)) return false;
      }
      return previous->num_ids() > 0;
    }();
    started_from += all_declared;
    // The new index must not depend on the previous one (or its program) once built.
    previous.reset();
    older.reset();
    before.Clear();
    GraphIndex fresh(now);
    ASSERT_EQ(FullDump(extended, now), FullDump(fresh, now)) << "seed " << seed << "\n" << now.DebugString();
  }
  // The generator must exercise the reuse path, not only the fallback.
  EXPECT_GT(started_from, 3000);
}

TEST(GraphIndexTest, VerifierAnswersTheSameWithOrWithoutThePreviousIndex) {
  int valid = 0;
  for (int seed = 0; seed < 3000; ++seed) {
    Rand r(seed + 100000);
    const int pool = 2 + r.Below(5);
    Program before = RandomProgram(r, pool);
    // relu ops of the right arity, so most programs get past the arity check.
    auto fix_arity = [&](Program& p) {
      for (Op& op : *p.mutable_op()) {
        while (op.input_size() > 1) op.mutable_input()->RemoveLast();
        while (op.output_size() > 1) op.mutable_output()->RemoveLast();
        if (op.input_size() == 0) op.add_input(RandomName(r, pool));
        if (op.output_size() == 0) op.add_output(RandomName(r, pool));
      }
    };
    fix_arity(before);
    // Often a valid chain: every var F32 [2], op i reads a feed or op i-1's output.
    if (r.Chance(50) && before.var_size() > 1) {
      for (Var& v : *before.mutable_var()) {
        v.set_dtype(F32);
        v.clear_shape();
        v.add_shape(2);
        v.set_kind(ACTIVATION);
      }
      before.mutable_var(0)->set_kind(FEED);
      for (int i = 0; i < before.op_size(); ++i) {
        before.mutable_op(i)->set_input(0, before.var(i % before.var_size()).name());
        before.mutable_op(i)->set_output(0, before.var((i + 1) % before.var_size()).name());
      }
    }
    GraphIndex prev_index(before);
    Program now = before;
    Mutate(now, r, pool);
    fix_arity(now);
    auto with = VerifyAndIndexProgram(now, &prev_index);
    auto without = VerifyAndIndexProgram(now);
    ASSERT_EQ(with.status(), without.status()) << "seed " << seed;
    if (with.ok()) {
      ++valid;
      ASSERT_EQ(FullDump(**with, now), FullDump(**without, now)) << "seed " << seed;
    }
  }
  EXPECT_GT(valid, 100);
}

}  // namespace
}  // namespace strata
