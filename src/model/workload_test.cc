#include "model/workload.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpupool {
namespace {

// True when `st` failed with InvalidArgument and its message contains every one of `needles`.
::testing::AssertionResult InvalidNaming(const Status& st, const std::vector<std::string>& needles) {
  if (st.ok()) return ::testing::AssertionFailure() << "unexpectedly OK";
  if (st.code() != StatusCode::kInvalidArgument) return ::testing::AssertionFailure() << st.ToString();
  for (const std::string& needle : needles) {
    if (st.message().find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << st.message() << "' does not mention '" << needle << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

TaskRequest CpuOnly() {
  TaskRequest r;
  r.cpu = MilliCpu(500);
  r.memory = MiB(512);
  return r;
}

TaskRequest Gpus(int count, int64_t share_milli) {
  TaskRequest r;
  r.cpu = MilliCpu(4000);
  r.memory = MiB(16384);
  r.gpu_count = count;
  r.gpu_share = MilliGpu(share_milli);
  return r;
}

TaskRequest Mig(const std::string& profile) {
  TaskRequest r;
  r.cpu = MilliCpu(1000);
  r.memory = MiB(4096);
  r.gpu_count = 1;
  r.mig_profile = profile;
  return r;
}

// ---- ValidateTaskRequest: accepted shapes ------------------------------------------------------

// The shapes workload.h lists: CPU-only, a share of one GPU, whole GPUs, per-GPU share on several
// GPUs, optional per-GPU memory and models, and one MIG instance by full or short profile name.
TEST(WorkloadTest, AcceptsEveryDocumentedShape) {
  EXPECT_TRUE(ValidateTaskRequest(TaskRequest{}).ok());  // zero everything: an empty CPU task
  EXPECT_TRUE(ValidateTaskRequest(CpuOnly()).ok());
  EXPECT_TRUE(ValidateTaskRequest(Gpus(1, 1)).ok());  // the smallest share
  EXPECT_TRUE(ValidateTaskRequest(Gpus(1, 500)).ok());
  EXPECT_TRUE(ValidateTaskRequest(Gpus(1, 1000)).ok());  // one whole GPU
  EXPECT_TRUE(ValidateTaskRequest(Gpus(8, 1000)).ok());
  EXPECT_TRUE(ValidateTaskRequest(Gpus(2, 500)).ok());  // per-GPU share on several GPUs
  TaskRequest with_memory = Gpus(1, 300);
  with_memory.gpu_memory = MiB(4096);
  EXPECT_TRUE(ValidateTaskRequest(with_memory).ok());
  TaskRequest with_models = Gpus(2, 1000);
  with_models.gpu_models = {"A100-80GB", "H100-80GB"};
  EXPECT_TRUE(ValidateTaskRequest(with_models).ok());
  EXPECT_TRUE(ValidateTaskRequest(Mig("3g.40gb")).ok());
  EXPECT_TRUE(ValidateTaskRequest(Mig("3g")).ok());
  TaskRequest mig_models = Mig("1g");
  mig_models.gpu_models = {"A100-80GB"};
  EXPECT_TRUE(ValidateTaskRequest(mig_models).ok());
}

// ---- ValidateTaskRequest: rejections, each naming the problem ----------------------------------

TEST(WorkloadTest, RejectsNegativeAmounts) {
  TaskRequest r = CpuOnly();
  r.cpu = MilliCpu(-1);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"cpu must not be negative"}));
  r = CpuOnly();
  r.memory = MiB(-1);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"memory must not be negative"}));
  r = CpuOnly();
  r.gpu_count = -1;
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"gpu count must not be negative", "-1"}));
  r = Gpus(1, 500);
  r.gpu_memory = MiB(-5);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"GPU memory must not be negative"}));
}

// gpu_count == 0 means CPU-only, and then every GPU field must be empty (workload.h): a stray share,
// GPU memory, MIG profile or model list would otherwise be silently ignored by the scheduler.
TEST(WorkloadTest, CpuOnlyTaskMustNotCarryGpuFields) {
  TaskRequest r = CpuOnly();
  r.gpu_share = MilliGpu(500);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"without GPUs", "GPU share"}));
  r = CpuOnly();
  r.gpu_memory = MiB(1024);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"without GPUs", "GPU memory"}));
  r = CpuOnly();
  r.mig_profile = "1g.10gb";
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"without GPUs", "MIG profile"}));
  r = CpuOnly();
  r.gpu_models = {"T4"};
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"without GPUs", "GPU models"}));
}

// A non-MIG GPU task needs a per-GPU share of 1..1000 milli-GPU; the message gives the value.
TEST(WorkloadTest, GpuShareMustBeBetweenOneAndAWholeGpu) {
  EXPECT_TRUE(
      InvalidNaming(ValidateTaskRequest(Gpus(1, 0)), {"GPU share must be between 1 and 1000", "got 0"}));
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(Gpus(1, 1001)), {"got 1001"}));
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(Gpus(2, 2000)), {"per GPU", "got 2000"}));
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(Gpus(1, -250)), {"got -250"}));
}

// A MIG request is exactly one instance, with no share or GPU memory of its own (the profile fixes
// both).
TEST(WorkloadTest, MigRequestIsExactlyOneInstance) {
  TaskRequest r = Mig("3g.40gb");
  r.gpu_count = 2;
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"exactly one instance", "gpu count 2"}));
  r = Mig("3g.40gb");
  r.gpu_count = 0;  // a MIG profile without a GPU is a CPU task with a GPU field
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"MIG profile"}));
  r = Mig("3g.40gb");
  r.gpu_share = MilliGpu(1000);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"MIG request cannot also ask for GPU share"}));
  r = Mig("3g.40gb");
  r.gpu_memory = MiB(40960);
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"GPU memory"}));
}

// An empty name in the model list matches nothing; it is a typo, for MIG and non-MIG requests alike.
TEST(WorkloadTest, RejectsEmptyModelName) {
  TaskRequest r = Gpus(1, 500);
  r.gpu_models = {"T4", ""};
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"GPU model name is empty"}));
  r = Mig("1g");
  r.gpu_models = {""};
  EXPECT_TRUE(InvalidNaming(ValidateTaskRequest(r), {"GPU model name is empty"}));
}

// ---- TaskRequest helpers and description -------------------------------------------------------

TEST(WorkloadTest, RequestHelpers) {
  EXPECT_FALSE(CpuOnly().wants_gpu());
  EXPECT_FALSE(CpuOnly().is_share());
  EXPECT_TRUE(Gpus(1, 500).is_share());
  EXPECT_FALSE(Gpus(1, 1000).is_share());  // a whole GPU is not a share
  EXPECT_FALSE(Gpus(2, 500).is_share());   // several GPUs are not a share
  EXPECT_FALSE(Mig("1g").is_share());      // MIG instances are their own kind
  EXPECT_TRUE(Mig("1g").wants_mig());
  EXPECT_TRUE(Mig("1g").wants_gpu());
  EXPECT_EQ(Gpus(4, 500).total_gpu_share(), MilliGpu(2000));
  EXPECT_EQ(Gpus(1, 1000), Gpus(1, 1000));
  EXPECT_NE(Gpus(1, 1000), Gpus(1, 999));
}

TEST(WorkloadTest, DescribeTaskRequest) {
  TaskRequest r = Gpus(2, 1000);
  r.gpu_models = {"A100-80GB"};
  EXPECT_EQ(DescribeTaskRequest(r), "cpu=4 mem=16Gi gpu=2x1 models=[A100-80GB]");  // workload.h's example
  EXPECT_EQ(DescribeTaskRequest(CpuOnly()), "cpu=0.5 mem=512Mi");
  TaskRequest share = Gpus(1, 250);
  share.gpu_memory = MiB(2048);
  EXPECT_EQ(DescribeTaskRequest(share), "cpu=4 mem=16Gi gpu=1x0.25 gpumem=2Gi");
  EXPECT_EQ(DescribeTaskRequest(Mig("3g.40gb")), "cpu=1 mem=4Gi mig=3g.40gb");
}

// ---- QoS --------------------------------------------------------------------------------------

TEST(WorkloadTest, QosNamesRoundTrip) {
  for (QosClass qos : {QosClass::kGuaranteed, QosClass::kBurstable, QosClass::kBestEffort}) {
    const Result<QosClass> parsed = ParseQosClass(QosClassName(qos));
    ASSERT_TRUE(parsed.ok()) << QosClassName(qos);
    EXPECT_EQ(*parsed, qos);
  }
  EXPECT_EQ(QosClassName(QosClass::kGuaranteed), "guaranteed");
  EXPECT_EQ(QosClassName(QosClass::kBurstable), "burstable");
  EXPECT_EQ(QosClassName(QosClass::kBestEffort), "best-effort");
  EXPECT_EQ(*ParseQosClass("besteffort"), QosClass::kBestEffort);  // accepted spelling without dash
}

TEST(WorkloadTest, UnknownQosIsRejectedWithTheChoices) {
  const Status st = ParseQosClass("platinum").status();
  EXPECT_TRUE(InvalidNaming(st, {"unknown QoS class 'platinum'", "guaranteed", "burstable", "best-effort"}));
  EXPECT_FALSE(ParseQosClass("").ok());
}

// ---- Jobs -------------------------------------------------------------------------------------

Job TrainingJob() {
  Job job;
  job.id = "j-1";
  job.name = "train";
  job.qos = QosClass::kBestEffort;
  job.groups.push_back(TaskGroup{"ps", 2, CpuOnly(), {}});
  job.groups.push_back(TaskGroup{"workers", 4, Gpus(1, 1000), {}});
  return job;
}

TEST(WorkloadTest, TaskCountAndGangSize) {
  Job job = TrainingJob();
  EXPECT_EQ(job.task_count(), 6);
  EXPECT_EQ(job.gang_size(), 6);  // min_available 0: all tasks
  job.min_available = 4;
  EXPECT_EQ(job.gang_size(), 4);
  EXPECT_EQ(Job{}.task_count(), 0);
}

TEST(WorkloadTest, ValidJobs) {
  Job job = TrainingJob();
  EXPECT_TRUE(ValidateJob(job).ok());
  job.min_available = 6;  // == task count: all of them
  EXPECT_TRUE(ValidateJob(job).ok());
  job.min_available = 1;
  EXPECT_TRUE(ValidateJob(job).ok());
}

TEST(WorkloadTest, JobWithoutGroupsIsRejectedNamingTheJob) {
  Job job = TrainingJob();
  job.groups.clear();
  EXPECT_TRUE(InvalidNaming(ValidateJob(job), {"job 'train'", "has no tasks"}));
  job.name.clear();  // an unnamed job is still called something readable
  EXPECT_TRUE(InvalidNaming(ValidateJob(job), {"job: has no tasks"}));
}

TEST(WorkloadTest, ReplicasMustBePositive) {
  Job job = TrainingJob();
  job.groups[1].replicas = 0;
  EXPECT_TRUE(InvalidNaming(ValidateJob(job),
                            {"job 'train': task group 'workers'", "replicas must be at least 1", "got 0"}));
  job.groups[1].name.clear();  // an unnamed group is named by its position
  EXPECT_TRUE(InvalidNaming(ValidateJob(job), {"task group 1:"}));
}

// A bad task request inside a group keeps its own message, prefixed by where it is.
TEST(WorkloadTest, BadTaskInGroupIsReportedWithItsPlace) {
  Job job = TrainingJob();
  job.groups[1].request.gpu_share = MilliGpu(0);
  const Status st = ValidateJob(job);
  EXPECT_TRUE(InvalidNaming(st, {"job 'train': task group 'workers': GPU share must be between 1 and 1000"}));
}

// min_available is 0 (all) or 1..task count; anything else can never be met.
TEST(WorkloadTest, MinAvailableOutOfRange) {
  Job job = TrainingJob();
  job.min_available = 7;
  EXPECT_TRUE(InvalidNaming(ValidateJob(job), {"minAvailable 7", "task count 6"}));
  job.min_available = -1;
  EXPECT_TRUE(InvalidNaming(ValidateJob(job), {"minAvailable -1"}));
}

}  // namespace
}  // namespace gpupool
