#include "analysis/sample_forms.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "proto/shape_rules.h"
#include "proto/types.h"

namespace strata {
namespace {

using Form = SampleForm;

// The axis of the batch dim (-1) in a shape, or -1 without one.
int BatchAxis(const Var& v) {
  for (int a = 0; a < v.shape_size(); ++a) {
    if (v.shape(a) < 0) return a;
  }
  return -1;
}

int64_t DimsProduct(const Var& v, int begin, int end) {
  int64_t p = 1;
  for (int a = begin; a < end; ++a) p *= v.shape(a);
  return p;
}

// Whether `axis` of a shape of `rank` names the batch axis `b` (validation
// has checked the axis's range).
bool IsAxis(int64_t axis, int rank, int b) {
  const absl::StatusOr<int> a = NormalizeAxis(axis, rank, "axis");
  return b >= 0 && a.ok() && *a == b;
}

const AttrValue* FindAttr(const Op& op, const std::string& name) {
  auto it = op.attr().find(name);
  return it == op.attr().end() ? nullptr : &it->second;
}

int64_t IntAttr(const Op& op, const std::string& name, int64_t fallback) {
  const AttrValue* a = FindAttr(op, name);
  return a != nullptr && a->value_case() == AttrValue::kI ? a->i() : fallback;
}

bool BoolAttr(const Op& op, const std::string& name) {
  const AttrValue* a = FindAttr(op, name);
  return a != nullptr && a->value_case() == AttrValue::kB && a->b();
}

std::vector<int64_t> IntsAttr(const Op& op, const std::string& name) {
  const AttrValue* a = FindAttr(op, name);
  if (a == nullptr || a->value_case() != AttrValue::kList) return {};
  return std::vector<int64_t>(a->list().i().begin(), a->list().i().end());
}

class Analyzer {
 public:
  explicit Analyzer(const Program& program) : program_(program), forms_(program.var_size()) {
    for (int i = 0; i < program.var_size(); ++i) {
      index_.emplace(program.var(i).name(), i);
      const Var& v = program.var(i);
      if (v.kind() == FEED && BatchAxis(v) >= 0) forms_[i].form = Form::kPerSample;
    }
  }

  std::vector<VarSampleForm> Run() && {
    for (int i = 0; i < program_.op_size(); ++i) Visit(i);
    return std::move(forms_);
  }

 private:
  const Var* FindVar(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &program_.var(it->second);
  }
  const VarSampleForm& FormOf(const std::string& name) const {
    static const VarSampleForm kConstant;
    auto it = index_.find(name);
    return it == index_.end() ? kConstant : forms_[it->second];
  }

  VarSampleForm PerSample() const { return {Form::kPerSample, "", ""}; }
  VarSampleForm Mixed(std::string why) const { return {Form::kMixed, where_, std::move(why)}; }
  // A mean or sum made here from per-sample values.
  VarSampleForm Made(Form form) const { return {form, where_, ""}; }

  void Visit(int i) {
    const Op& op = program_.op(i);
    where_ = OpLocation(program_, i);
    op_ = &op;
    VarSampleForm out = Transfer();
    for (const std::string& name : op.output()) {
      auto it = index_.find(name);
      if (it == index_.end()) continue;
      VarSampleForm f = out;
      const bool batched = BatchAxis(program_.var(it->second)) >= 0;
      if (f.form == Form::kPerSample && !batched) {
        f = Mixed(absl::StrCat("gives '", name, "' without the batch dimension from per-sample values"));
      } else if (f.form != Form::kPerSample && f.form != Form::kMixed && batched) {
        f = Mixed(absl::StrCat("gives '", name, "' a batch dimension from batch-wide values"));
      }
      forms_[it->second] = std::move(f);
    }
  }

  // The form of the op's outputs from its inputs'.
  VarSampleForm Transfer() {
    const Op& op = *op_;
    ins_.clear();
    for (const std::string& name : op.input()) ins_.push_back(&FormOf(name));
    for (const VarSampleForm* f : ins_) {
      if (f->form == Form::kMixed) return *f;  // where the samples met first
    }
    const std::string& t = op.type();
    const bool constant_inputs =
        std::all_of(ins_.begin(), ins_.end(), [](const VarSampleForm* f) { return f->form == Form::kConstant; });
    // Dropout numbers its mask by the sample (the input's row along dim 0,
    // offset by the part's first sample), so every part draws another mask
    // on a value without the batch dim first.
    if (t == "dropout") {
      const AttrValue* p = FindAttr(op, "p");
      if (p != nullptr && p->f() == 0) return *ins_[0];
      if (constant_inputs) return Mixed("draws its mask by sample on a value without the batch dim: each part draws another");
      return RowsOf(1, /*batch_first=*/true, "");
    }
    if (constant_inputs) return {};
    static const std::set<std::string> kNonlinear = {"relu", "gelu", "tanh", "sigmoid", "exp", "log", "sqrt", "square"};
    static const std::set<std::string> kLinearUnary = {"neg", "identity", "transpose", "scale"};
    if (kNonlinear.count(t)) return Nonlinear();
    if (kLinearUnary.count(t)) return Linear();
    // A cast to an integer or BOOL rounds: not linear.
    if (t == "cast") {
      const AttrValue* dtype = FindAttr(op, "dtype");
      DataType to = DT_INVALID;
      const bool floating = dtype != nullptr && DataType_Parse(dtype->s(), &to) && IsFloating(to);
      return floating ? Linear() : Nonlinear();
    }
    if (t == "add" || t == "sub" || t == "add_n") return AddLike();
    if (t == "mul" || t == "div") return MulLike(/*divides=*/t == "div");
    if (t == "reduce_sum" || t == "reduce_mean") return Reduce(t == "reduce_mean" ? Form::kMean : Form::kSum);
    if (t == "softmax" || t == "log_softmax") {
      return AlongAxis(IntAttr(op, "axis", -1), "normalizes along the batch axis");
    }
    // (Shape inference refuses a layer_norm over a batch last dim.)
    if (t == "layer_norm") return Nonlinear();
    // Shape inference refuses to join, split or pad along the batch axis and
    // slices it only whole, so these move each sample's values apart.
    if (t == "split" || t == "pad" || t == "slice") return Linear();
    if (t == "concat") return Concat();
    if (t == "reshape" || t == "flatten" || t == "reshape_like") return Reshape();
    if (t == "matmul" || t == "matmul_bias" || t == "matmul_bias_gelu") return Matmul();
    // An embedding looks up each id on its own, wherever the batch dim is.
    if (t == "embedding") return RowsOf(/*data_inputs=*/1, /*batch_first=*/false, "looks up a table computed from the data");
    if (t == "conv2d") return RowsOf(1, true, "convolves with a filter computed from the data");
    if (t == "max_pool2d" || t == "avg_pool2d") return RowsOf(1, true, "");
    if (t == "scaled_dot_product_attention" || t == "scaled_dot_product_attention_qkv") {
      return RowsOf(op.input_size(), true, "");
    }
    if (t == "softmax_cross_entropy" || t == "accuracy" || t == "mse_loss") return MeanOverRows();
    if (t == "sum_to_like") return SumToLike();
    // A sum over every element: over samples too.
    if (t == "sum_squares") return AnyInput(Form::kPerSample) && OnlyForm() == Form::kPerSample ? Made(Form::kSum) : Nonlinear();
    // Values (a per-sample one, or a constant) repeated along other axes.
    if (t == "broadcast_like") {
      const bool statistic = ins_[0]->form == Form::kMean || ins_[0]->form == Form::kSum;
      if (statistic) return Mixed("combines per-sample values with a mean or sum over the batch");
      // With `mean` it divides by the count of the dims it repeats over: the
      // part's batch size among them, where those take in x's batch axis.
      if (BoolAttr(op, "mean") && RepeatsOverBatch()) {
        return Mixed("divides by the number of samples (mean: true over the batch axis), which each part has its own of");
      }
      return PerSample();
    }
    if (t == "fill_like") {
      return ins_[0]->form == Form::kPerSample ? PerSample() : VarSampleForm{};
    }
    return Mixed("is an op whose treatment of the batch's samples Strata does not know");
  }

  // The batch axis of input k, or -1 (not batched, or undeclared).
  int InputBatchAxis(int k) const {
    const Var* v = FindVar(op_->input(k));
    return v == nullptr ? -1 : BatchAxis(*v);
  }
  int InputRank(int k) const {
    const Var* v = FindVar(op_->input(k));
    return v == nullptr ? 0 : v->shape_size();
  }
  // broadcast_like(dy, x, axis): whether the dims it repeats dy over (every
  // dim of x when `axis` is empty) take in x's batch axis.
  bool RepeatsOverBatch() const {
    const int b = InputBatchAxis(1), rank = InputRank(1);
    if (b < 0) return false;
    const std::vector<int64_t> axes = IntsAttr(*op_, "axis");
    if (axes.empty()) return true;
    return std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return IsAxis(a, rank, b); });
  }
  bool AnyInput(Form form) const {
    return std::any_of(ins_.begin(), ins_.end(), [form](const VarSampleForm* f) { return f->form == form; });
  }
  // The one non-constant form of the inputs, or kMixed when they differ.
  Form OnlyForm() const {
    Form only = Form::kConstant;
    for (const VarSampleForm* f : ins_) {
      if (f->form == Form::kConstant) continue;
      if (only != Form::kConstant && only != f->form) return Form::kMixed;
      only = f->form;
    }
    return only;
  }
  // The first non-constant input's form (a mean or sum passed through keeps
  // the op that made it).
  const VarSampleForm& FirstVarying() const {
    for (const VarSampleForm* f : ins_) {
      if (f->form != Form::kConstant) return *f;
    }
    return *ins_[0];
  }
  // Whether an input is a mean or sum over the batch's samples.
  bool AnyStatistic() const { return AnyInput(Form::kMean) || AnyInput(Form::kSum); }
  // How many inputs depend on the data.
  int VaryingInputs() const {
    return static_cast<int>(
        std::count_if(ins_.begin(), ins_.end(), [](const VarSampleForm* f) { return f->form != Form::kConstant; }));
  }
  VarSampleForm NonlinearOfStatistic() const {
    return Mixed("applies a nonlinearity to a mean or sum over the batch's samples");
  }
  VarSampleForm Nonlinear() const { return AnyStatistic() ? NonlinearOfStatistic() : PerSample(); }

  // Linear (or affine) in its one varying input: the form passes through.
  // (A constant added to a sum leaves it a sum: still not a mean.)
  VarSampleForm Linear() const {
    VarSampleForm f = FirstVarying();
    const AttrValue* bias = op_->type() == "scale" ? FindAttr(*op_, "bias") : nullptr;
    if (bias != nullptr && bias->f() != 0) return WithOffset(std::move(f));
    return f;
  }
  // `f`, plus a constant added here (a sum's offset; a mean stays a mean).
  VarSampleForm WithOffset(VarSampleForm f) const {
    if (f.form == Form::kSum && f.offset_at.empty()) f.offset_at = where_;
    return f;
  }

  // add, sub, add_n: per-sample values with each other or constants; means
  // with means and constants (an affine mean); sums with sums or constants.
  VarSampleForm AddLike() const {
    const Form only = OnlyForm();
    if (only == Form::kMixed) {
      if (AnyInput(Form::kPerSample)) return Mixed("combines per-sample values with a mean or sum over the batch");
      const auto sum = std::find_if(ins_.begin(), ins_.end(), [](const VarSampleForm* f) { return f->form == Form::kSum; });
      return Mixed(absl::StrCat("adds a mean over the batch's samples to a sum over them (", (*sum)->origin, ")"));
    }
    if (only == Form::kPerSample) return Broadcast();
    return Joined();
  }

  // Means or sums of one kind joined with each other and with constants (an
  // add, a concat): a sum beside a constant carries it as an offset, which
  // the parts' total would count once per part.
  VarSampleForm Joined() const {
    VarSampleForm f = FirstVarying();
    for (const VarSampleForm* in : ins_) {
      if (!in->offset_at.empty() && f.offset_at.empty()) f.offset_at = in->offset_at;
    }
    return VaryingInputs() < static_cast<int>(ins_.size()) ? WithOffset(std::move(f)) : f;
  }

  // mul, div: a mean or sum times (or over) a constant stays one.
  VarSampleForm MulLike(bool divides) const {
    if (OnlyForm() == Form::kPerSample) return Broadcast();
    if (AnyInput(Form::kPerSample)) return Mixed("combines per-sample values with a mean or sum over the batch");
    if (divides && ins_[1]->form != Form::kConstant) return Mixed("divides by a mean or sum over the batch's samples");
    if (VaryingInputs() > 1) return Mixed("multiplies two means or sums over the batch's samples");
    return FirstVarying();
  }

  // Per-sample inputs broadcast together: each one's batch dim must land on
  // the output's.
  VarSampleForm Broadcast() const {
    const Var* out = op_->output_size() > 0 ? FindVar(op_->output(0)) : nullptr;
    if (out == nullptr) return Mixed("has no declared output");
    const int out_axis = BatchAxis(*out), out_rank = out->shape_size();
    for (int k = 0; k < op_->input_size(); ++k) {
      if (ins_[k]->form != Form::kPerSample) continue;
      if (InputBatchAxis(k) + out_rank - InputRank(k) != out_axis) {
        return Mixed("broadcasts a batch dimension onto another axis");
      }
    }
    return PerSample();
  }

  // Per-sample values stay so unless `axis` of input 0 is its batch axis.
  VarSampleForm AlongAxis(int64_t axis, const std::string& why) const {
    if (AnyStatistic()) return NonlinearOfStatistic();
    if (IsAxis(axis, InputRank(0), InputBatchAxis(0))) return Mixed(why);
    return PerSample();
  }

  VarSampleForm Concat() const {
    const Form only = OnlyForm();
    if (only == Form::kMixed) return Mixed("joins per-sample values with a mean or sum over the batch");
    if (only == Form::kPerSample) return PerSample();
    return Joined();
  }

  VarSampleForm Reduce(Form made) const {
    if (ins_[0]->form != Form::kPerSample) return Linear();
    const int b = InputBatchAxis(0), rank = InputRank(0);
    const std::vector<int64_t> axes = IntsAttr(*op_, "axis");
    bool over_batch = axes.empty();
    for (int64_t axis : axes) over_batch |= IsAxis(axis, rank, b);
    return over_batch ? Made(made) : PerSample();
  }

  // Shape inference keeps a batch entry's element count, so a reshape keeps
  // each entry one sample's when as many elements come before the batch dim
  // as did: [B, 4] -> [B, 2, 2] does, [B, 4] -> [2, B, 2] interleaves.
  VarSampleForm Reshape() const {
    if (ins_[0]->form != Form::kPerSample) return Linear();
    const Var* in = FindVar(op_->input(0));
    const Var* out = op_->output_size() > 0 ? FindVar(op_->output(0)) : nullptr;
    if (in == nullptr || out == nullptr) return Mixed("has an undeclared input or output");
    const int bi = BatchAxis(*in), bo = BatchAxis(*out);
    if (bi < 0 || bo < 0) return Mixed("reshapes the batch dimension away");
    if (DimsProduct(*in, 0, bi) != DimsProduct(*out, 0, bo)) {
      return Mixed("reshapes so that entries of the batch dimension hold parts of several samples");
    }
    return PerSample();
  }

  // matmul (with a bias, and gelu): per-sample rows times constants stay per
  // sample; a contraction over the batch dim sums over samples; a mean or
  // sum times constants stays one.
  VarSampleForm Matmul() const {
    const bool gelu = op_->type() == "matmul_bias_gelu";
    const Form only = OnlyForm();
    if (only == Form::kMixed) return Mixed("multiplies per-sample values with a mean or sum over the batch");
    // matmul_bias adds its bias (or, where the bias is the statistic, the
    // constant product): a sum's offset.
    const bool biased = op_->type() == "matmul_bias";
    if (only != Form::kPerSample) {
      if (VaryingInputs() > 1) return Mixed("multiplies two means or sums over the batch's samples");
      if (gelu) return NonlinearOfStatistic();
      return biased ? WithOffset(FirstVarying()) : FirstVarying();
    }
    const Var* out = op_->output_size() > 0 ? FindVar(op_->output(0)) : nullptr;
    if (out != nullptr && BatchAxis(*out) >= 0) return PerSample();
    // The batch dim was contracted: a sum over samples of their products.
    if (gelu) return Mixed("contracts over the batch dimension and then applies gelu");
    return biased ? WithOffset(Made(Form::kSum)) : Made(Form::kSum);
  }

  // Ops that treat each sample on its own when the first `data_inputs`
  // inputs carry the batch dim (first, where the op's layout reads it so)
  // and the others are constant.
  VarSampleForm RowsOf(int data_inputs, bool batch_first, const std::string& why_data_weights) const {
    for (int k = 0; k < op_->input_size(); ++k) {
      if (k >= data_inputs) {
        if (ins_[k]->form != Form::kConstant) return Mixed(why_data_weights);
        continue;
      }
      if (ins_[k]->form == Form::kMean || ins_[k]->form == Form::kSum) return NonlinearOfStatistic();
      if (batch_first && ins_[k]->form == Form::kPerSample && InputBatchAxis(k) != 0) {
        return Mixed("reads the batch dimension as another axis (it must come first)");
      }
    }
    return PerSample();
  }

  // Losses and metrics: the mean over rows (softmax_cross_entropy,
  // accuracy: every axis but the last, the classes) or over elements
  // (mse_loss) of per-row terms; each sample owns as many rows as another,
  // wherever its batch dim is, unless it is the classes'.
  VarSampleForm MeanOverRows() const {
    if (AnyStatistic()) return NonlinearOfStatistic();
    if (op_->type() != "mse_loss" && ins_[0]->form == Form::kPerSample && InputBatchAxis(0) == InputRank(0) - 1) {
      return Mixed("takes the batch dimension for its classes");
    }
    return Made(Form::kMean);
  }

  // The gradient of a broadcast: summing away the batch dim sums over samples.
  VarSampleForm SumToLike() const {
    if (ins_[0]->form != Form::kPerSample) return Linear();
    const Var* like = FindVar(op_->input(1));
    if (like != nullptr && BatchAxis(*like) >= 0) return PerSample();
    return Made(Form::kSum);
  }

  const Program& program_;
  std::vector<VarSampleForm> forms_;
  absl::flat_hash_map<std::string, int> index_;
  // The op being visited.
  const Op* op_ = nullptr;
  std::string where_;
  std::vector<const VarSampleForm*> ins_;
};

}  // namespace

std::vector<VarSampleForm> SampleForms(const Program& program) { return Analyzer(program).Run(); }

namespace {

// The form of each fetch, in the program's order.
std::vector<std::pair<std::string, VarSampleForm>> FetchForms(const Program& program) {
  const std::vector<VarSampleForm> forms = SampleForms(program);
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < program.var_size(); ++i) index.emplace(program.var(i).name(), i);
  std::vector<std::pair<std::string, VarSampleForm>> out;
  for (const std::string& f : program.fetch()) {
    auto it = index.find(f);
    if (it != index.end()) out.emplace_back(f, forms[it->second]);
  }
  return out;
}

}  // namespace

std::vector<std::string> SummedFetches(const Program& program) {
  std::vector<std::string> out;
  for (const auto& [name, f] : FetchForms(program)) {
    if (f.form == Form::kSum && f.offset_at.empty()) out.push_back(name);
  }
  return out;
}

absl::Status CheckFetchesCombine(const Program& program) {
  for (const auto& [name, f] : FetchForms(program)) {
    if (f.form == Form::kSum && !f.offset_at.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the fetch '", name, "' is a sum over the batch's samples (", f.origin, ") plus a constant (", f.offset_at,
          "), which the parts' total would count once per part; fetch the sum and the constant apart"));
    }
    if (f.form == Form::kMixed || f.form == Form::kPerSample) {
      return absl::InvalidArgumentError(absl::StrCat("the fetch '", name,
                                                     "' changes with how the batch is split: ", f.origin, " ", f.why,
                                                     "; fetch a mean or a sum over samples, or leave it out"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LossCombine> LossCombination(const Program& program) {
  const std::vector<VarSampleForm> forms = SampleForms(program);
  for (int i = 0; i < program.var_size(); ++i) {
    if (program.var(i).name() != program.loss()) continue;
    const VarSampleForm& f = forms[i];
    switch (f.form) {
      case Form::kConstant:
      case Form::kMean:
        return LossCombine::kAverage;
      case Form::kSum:
        if (f.offset_at.empty()) return LossCombine::kSum;
        return absl::InvalidArgumentError(absl::StrCat(
            "the loss '", program.loss(), "' is a sum over the batch's samples (", f.origin, ") plus a constant (",
            f.offset_at, "), which the parts' total would count once per part: make the sum a mean",
            absl::StrContains(f.origin, "'reduce_sum'") ? " (reduce_mean)" : "", " or leave the constant out"));
      case Form::kPerSample:  // (validation holds the loss a scalar)
      case Form::kMixed:
        return absl::InvalidArgumentError(absl::StrCat("the loss '", program.loss(),
                                                       "' changes with how the batch is split: ", f.origin, " ",
                                                       f.why));
    }
  }
  return LossCombine::kAverage;
}

}  // namespace strata
