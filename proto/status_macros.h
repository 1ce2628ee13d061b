#ifndef STRATA_PROTO_STATUS_MACROS_H_
#define STRATA_PROTO_STATUS_MACROS_H_

// Strata's one pair of status macros (convention 16), for every package.
// Callers that prefix messages do so at the call site, not here.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Ends the calling function with expr's status when that is not OK.
#define STRATA_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    absl::Status strata_status_ = (expr);              \
    if (!strata_status_.ok()) return strata_status_;   \
  } while (0)

// STRATA_ASSIGN_OR_RETURN(Tensor* y, ctx.AllocateOutput(0, F32, shape));
// Declares or assigns lhs from expr's value, or ends the calling function with
// its status. Expands to several statements: not for an unbraced if body.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_MACROS_CONCAT_(strata_statusor_, __LINE__), lhs, expr)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(*statusor)

#define STRATA_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define STRATA_STATUS_MACROS_CONCAT_(a, b) STRATA_STATUS_MACROS_CONCAT_INNER_(a, b)

#endif  // STRATA_PROTO_STATUS_MACROS_H_
