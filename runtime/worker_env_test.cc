#include "runtime/worker_env.h"

#include <cstdlib>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::optional<WorkerEnv>> FromVars(const std::map<std::string, std::string>& vars) {
  return WorkerEnvFromLookup([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The error for `vars` must be InvalidArgument and name `variable`.
void ExpectRejected(const std::map<std::string, std::string>& vars, const std::string& variable) {
  auto env = FromVars(vars);
  ASSERT_FALSE(env.ok()) << "accepted " << variable;
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(env.status().message()), HasSubstr(variable));
}

TEST(WorkerEnvTest, NoneWhenNothingIsSet) {
  auto env = FromVars({{"HOME", "/root"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "10.0.0.1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(env->has_value());
}

TEST(WorkerEnvTest, ReadsOurLauncherVariables) {
  auto env = FromVars({{"STRATA_RANK", "2"},
                       {"STRATA_WORLD_SIZE", "4"},
                       {"STRATA_LOCAL_RANK", "2"},
                       {"STRATA_STORE", "file:///tmp/strata_store.abc"},
                       {"STRATA_MASTER_ADDR", "127.0.0.1"},
                       {"STRATA_MASTER_PORT", "29500"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  const WorkerEnv& w = **env;
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 2);
  EXPECT_EQ(w.store_spec, "file:///tmp/strata_store.abc");
  EXPECT_EQ(w.master_addr, "127.0.0.1");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_TRUE(w.from_launcher);
}

TEST(WorkerEnvTest, OurVariablesWinOverTorchrunAndSlurm) {
  auto env = FromVars({{"STRATA_RANK", "1"},
                       {"STRATA_WORLD_SIZE", "2"},
                       {"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"SLURM_PROCID", "3"},
                       {"SLURM_NTASKS", "16"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((*env)->rank, 1);
  EXPECT_EQ((*env)->world_size, 2);
  EXPECT_EQ((*env)->local_rank, 1);  // defaults to the rank
  EXPECT_TRUE((*env)->from_launcher);
}

TEST(WorkerEnvTest, ReadsTorchrunVariables) {
  auto env = FromVars({{"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"MASTER_ADDR", "node0.cluster"},
                       {"MASTER_PORT", "29400"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "2"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  const WorkerEnv& w = **env;
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.master_addr, "node0.cluster");
  EXPECT_EQ(w.master_port, 29400);
  EXPECT_EQ(w.store_spec, "");
  EXPECT_FALSE(w.from_launcher);
  EXPECT_EQ(w.local_world_size, 0);  // not given: one machine assumed
}

// Two machines of 4 ranks: rank 5 is the second machine's rank 1, and its
// placement counts that machine's ranks, not the world's.
TEST(WorkerEnvTest, ReadsTorchrunsLocalWorldSize) {
  auto env = FromVars({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((**env).local_world_size, 4);
  EXPECT_FALSE(PlaceOnGpu((**env).local_rank, (**env).local_world_size, 4).shared);
  auto bad = FromVars({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "9"}});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("LOCAL_WORLD_SIZE=9"), std::string::npos) << bad.status();
}

TEST(WorkerEnvTest, TorchrunTakesAStoreFromStrataStore) {
  auto env = FromVars({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"STRATA_STORE", "file:///shared/store"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((*env)->store_spec, "file:///shared/store");
  EXPECT_EQ((*env)->master_addr, "");
  EXPECT_EQ((*env)->master_port, 0);
}

TEST(WorkerEnvTest, ReadsSlurmVariables) {
  auto env = FromVars({{"SLURM_PROCID", "3"},
                       {"SLURM_NTASKS", "4"},
                       {"SLURM_LOCALID", "1"},
                       {"MASTER_ADDR", "10.1.2.3"},
                       {"MASTER_PORT", "12345"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  const WorkerEnv& w = **env;
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.master_addr, "10.1.2.3");
  EXPECT_EQ(w.master_port, 12345);
  EXPECT_FALSE(w.from_launcher);
}

TEST(WorkerEnvTest, SlurmFallsBackToNprocs) {
  auto env = FromVars({{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "2"}});
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((*env)->world_size, 2);
  EXPECT_EQ((*env)->local_rank, 1);
}

TEST(WorkerEnvTest, RejectsNonNumericValues) {
  ExpectRejected({{"STRATA_RANK", "one"}, {"STRATA_WORLD_SIZE", "2"}}, "STRATA_RANK");
  ExpectRejected({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2x"}}, "STRATA_WORLD_SIZE");
  ExpectRejected({{"RANK", ""}, {"WORLD_SIZE", "2"}}, "RANK");
  ExpectRejected({{"RANK", "1.5"}, {"WORLD_SIZE", "2"}}, "RANK");
  ExpectRejected({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}, "RANK");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "gpu0"}}, "LOCAL_RANK");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}, "MASTER_PORT");
  ExpectRejected({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}, "WORLD_SIZE");
}

TEST(WorkerEnvTest, RejectsOutOfRangeValues) {
  ExpectRejected({{"STRATA_RANK", "2"}, {"STRATA_WORLD_SIZE", "2"}}, "STRATA_RANK");
  ExpectRejected({{"STRATA_RANK", "-1"}, {"STRATA_WORLD_SIZE", "2"}}, "STRATA_RANK");
  ExpectRejected({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "0"}}, "STRATA_WORLD_SIZE");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "-4"}}, "WORLD_SIZE");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}}, "LOCAL_RANK");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, "LOCAL_RANK");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}, "MASTER_PORT");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT");
  ExpectRejected({{"STRATA_RANK", "0"}, {"STRATA_WORLD_SIZE", "2"}, {"STRATA_MASTER_PORT", "-5"}},
                 "STRATA_MASTER_PORT");
  ExpectRejected({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID");
  ExpectRejected({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}, "MASTER_ADDR");
}

TEST(WorkerEnvTest, RejectsHalfAFlavour) {
  ExpectRejected({{"STRATA_RANK", "0"}}, "STRATA_WORLD_SIZE");
  ExpectRejected({{"WORLD_SIZE", "2"}}, "RANK");
  ExpectRejected({{"RANK", "1"}}, "WORLD_SIZE");
  ExpectRejected({{"SLURM_PROCID", "0"}}, "SLURM_NTASKS");
}

TEST(WorkerEnvTest, ReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("STRATA_RANK", "1", 1), 0);
  ASSERT_EQ(setenv("STRATA_WORLD_SIZE", "3", 1), 0);
  auto env = WorkerEnvFromEnvironment();
  unsetenv("STRATA_RANK");
  unsetenv("STRATA_WORLD_SIZE");
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((*env)->rank, 1);
  EXPECT_EQ((*env)->world_size, 3);
}

TEST(PlaceOnGpuTest, RanksTakeGpusRoundRobinAndStageThroughTheHost) {
  const GpuPlacement shared = PlaceOnGpu(3, 4, 1);
  EXPECT_EQ(shared.ordinal, 0);
  EXPECT_TRUE(shared.shared);
  EXPECT_TRUE(shared.staged);
  EXPECT_EQ(shared.note,
            "--device gpu: 4 rank(s) on 1 GPU(s), rank r on GPU r % 1; ranks sharing a GPU exchange tensors over "
            "Gloo, staged through pinned host memory");
  EXPECT_EQ(PlaceOnGpu(5, 8, 3).ordinal, 2);
  const GpuPlacement own = PlaceOnGpu(1, 2, 8);
  EXPECT_EQ(own.ordinal, 1);
  EXPECT_FALSE(own.shared);
  EXPECT_FALSE(own.staged);
  EXPECT_TRUE(own.nccl_collectives);
  EXPECT_FALSE(shared.nccl_collectives);
  EXPECT_NE(own.note.find("collectives, sends and receives over NCCL"), std::string::npos) << own.note;
}

// Once the ranks have said which GPU they opened: four ranks that each see
// one GPU (CUDA_VISIBLE_DEVICES per rank), counted as sharing it, have a
// GPU each by UUID; two ranks on one UUID stage every rank's tensors; an
// unnamed GPU leaves the count's guess.
TEST(PlaceOnGpuTest, TheGpusUuidsDecideWhetherRanksShareOne) {
  const GpuPlacement counted = PlaceOnGpu(2, 4, 1);
  ASSERT_TRUE(counted.shared);
  const GpuPlacement own = PlaceOnGpus(counted, {"GPU-a", "GPU-b", "GPU-c", "GPU-d"});
  EXPECT_FALSE(own.shared);
  EXPECT_FALSE(own.staged);
  EXPECT_TRUE(own.nccl_collectives);
  EXPECT_EQ(own.ordinal, 0) << "the ordinal is still the visible GPU's";
  EXPECT_EQ(own.note, "--device gpu: 4 rank(s) on 4 distinct GPUs (by UUID): collectives, sends and receives over NCCL");
  const GpuPlacement shared = PlaceOnGpus(PlaceOnGpu(0, 2, 8), {"GPU-a", "GPU-b", "GPU-a"});
  EXPECT_TRUE(shared.shared);
  EXPECT_TRUE(shared.staged);
  EXPECT_FALSE(shared.nccl_collectives);
  EXPECT_EQ(shared.note, "--device gpu: ranks 0 and 2 share GPU GPU-a, so every rank exchanges tensors over Gloo, "
                         "staged through pinned host memory");
  const GpuPlacement unnamed = PlaceOnGpus(counted, {"GPU-a", ""});
  EXPECT_EQ(unnamed.note, counted.note + " (rank 1 could not name its GPU, so GPUs are counted)");
  EXPECT_TRUE(unnamed.shared);
}

}  // namespace
}  // namespace strata
