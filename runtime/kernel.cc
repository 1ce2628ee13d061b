#include "runtime/kernel.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

absl::StatusOr<Tensor*> KernelContext::AllocateOutput(int i, DataType dtype, Shape shape) {
  // The executor hands a persistent output's buffer in (a PARAM_COPY,
  // rewritten in place): used when it fits.
  if (outputs_[i].defined() && outputs_[i].dtype() == dtype && outputs_[i].shape() == shape &&
      outputs_[i].device() == run_->device) {
    return &outputs_[i];
  }
  Tensor t = Tensor::Empty(dtype, shape, run_->device);
  if (!t.defined()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating ", DataTypeName(dtype),
                                                     ShapeString(shape), " (",
                                                     NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype)),
                                                     " bytes) on ", run_->device->name()));
  }
  outputs_[i] = std::move(t);
  return &outputs_[i];
}

KernelRegistry& KernelRegistry::Global() {
  static KernelRegistry* registry = new KernelRegistry();
  return *registry;
}

void KernelRegistry::Register(const std::string& op_type, DeviceKind device, DataType dtype,
                              KernelFactory factory) {
  entries_.emplace_back(op_type, device, dtype, std::move(factory));
}

const KernelFactory* KernelRegistry::Find(const std::string& op_type, DeviceKind device,
                                          DataType dtype) const {
  for (const auto& [type, dev, dt, factory] : entries_) {
    if (type == op_type && dev == device && dt == dtype) return &factory;
  }
  return nullptr;
}

void KernelRegistry::RegisterWorkspace(const std::string& op_type, DeviceKind device, WorkspaceFn fn) {
  workspaces_[device][op_type] = std::move(fn);
}

const WorkspaceFn* KernelRegistry::FindWorkspace(absl::string_view op_type, DeviceKind device) const {
  auto d = workspaces_.find(device);
  if (d == workspaces_.end()) return nullptr;
  auto it = d->second.find(op_type);
  return it == d->second.end() ? nullptr : &it->second;
}

std::vector<DataType> KernelRegistry::DtypesFor(const std::string& op_type, DeviceKind device) const {
  std::vector<DataType> out;
  for (const auto& [type, dev, dt, factory] : entries_) {
    if (type == op_type && dev == device) out.push_back(dt);
  }
  return out;
}

std::string DeviceKindLabel(DeviceKind kind) {
  switch (kind) {
    case DEVICE_CPU: return "cpu";
    case DEVICE_CUDA: return "cuda";
    default: return "unspecified";
  }
}

DataType KernelDtype(const KernelDef& def) {
  // The first floating input, 16-bit ones included: matmul_bias of BF16
  // operands and an F32 bias is the BF16 kernel.
  for (const auto& t : def.input_types) {
    if (IsFloating(t.dtype) || IsHalfFloating(t.dtype)) return t.dtype;
  }
  if (!def.input_types.empty()) return def.input_types[0].dtype;
  if (!def.output_types.empty()) return def.output_types[0].dtype;
  return DT_INVALID;
}

namespace {
absl::StatusOr<const AttrValue*> FindAttr(const Op& op, const std::string& name) {
  auto it = op.attr().find(name);
  if (it == op.attr().end()) {
    return absl::InternalError(absl::StrCat("op '", op.type(), "' has no attr '", name, "'"));
  }
  return &it->second;
}
}  // namespace

absl::StatusOr<int64_t> AttrInt(const Op& op, const std::string& name) {
  auto a = FindAttr(op, name);
  if (!a.ok()) return a.status();
  return (*a)->i();
}
absl::StatusOr<double> AttrFloat(const Op& op, const std::string& name) {
  auto a = FindAttr(op, name);
  if (!a.ok()) return a.status();
  return (*a)->value_case() == AttrValue::kI ? static_cast<double>((*a)->i()) : (*a)->f();
}
absl::StatusOr<bool> AttrBool(const Op& op, const std::string& name) {
  auto a = FindAttr(op, name);
  if (!a.ok()) return a.status();
  return (*a)->b();
}
absl::StatusOr<std::string> AttrString(const Op& op, const std::string& name) {
  auto a = FindAttr(op, name);
  if (!a.ok()) return a.status();
  return (*a)->s();
}
absl::StatusOr<std::vector<int64_t>> AttrInts(const Op& op, const std::string& name) {
  auto a = FindAttr(op, name);
  if (!a.ok()) return a.status();
  return std::vector<int64_t>((*a)->list().i().begin(), (*a)->list().i().end());
}

}  // namespace strata
