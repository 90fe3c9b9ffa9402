#include "sim/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "sim/csv.h"
#include "sim/test_files.h"

namespace gpupool {
namespace {

using testutil::TempFile;

const std::string kHeader = "timestamp,duration,num_gpus,gpu_time,cluster\n";

TEST(TimelineTest, ParsesUtcTimestamps) {
  EXPECT_EQ(*ParseUtcTimestamp("1970-01-01 00:00:00"), 0);
  EXPECT_EQ(*ParseUtcTimestamp("2017-10-09 07:01:55"), 1507532515);  // date -u -d ... +%s
  EXPECT_EQ(*ParseUtcTimestamp("2016-02-29 23:59:59"), 1456790399);
  for (const char* bad : {"2017-02-29 00:00:00", "2017-13-01 00:00:00", "2017-10-09T07:01:55", "2017-10-09 24:00:00",
                          "2017-10-09 07:01:5", "1969-12-31 23:59:59", "2017-1o-09 07:01:55", ""}) {
    EXPECT_FALSE(ParseUtcTimestamp(bad).ok()) << bad;
  }
}

TEST(TimelineTest, ReadsJobsSortedByArrivalWithGangsOfServerSizedTasks) {
  TempFile f("philly.csv", kHeader +
                               "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
                               "2017-10-09 07:00:00,10.5,12,126.0,6214e9\n"
                               "2017-10-09 07:01:55,1,16,16,6214e9\n");
  auto jobs = ReadPhillyJobs(f.path());
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 3u);
  const TimedJob& first = (*jobs)[0];
  EXPECT_EQ(first.name, "philly-3");
  EXPECT_EQ(first.arrival, 0);
  EXPECT_EQ(first.duration, 11);  // rounded up
  EXPECT_EQ(first.job.queue, "6214e9");
  EXPECT_EQ(first.job.tenant, "6214e9");
  ASSERT_EQ(first.job.groups.size(), 2u);  // 8 + 4
  EXPECT_EQ(first.job.groups[0].replicas, 1);
  EXPECT_EQ(first.job.groups[0].request.gpu_count, 8);
  EXPECT_EQ(first.job.groups[1].request.gpu_count, 4);
  EXPECT_EQ(first.job.gang_size(), 2);
  // Equal times keep the file's order.
  EXPECT_EQ((*jobs)[1].name, "philly-2");
  EXPECT_EQ((*jobs)[1].arrival, 115);
  EXPECT_EQ((*jobs)[1].job.groups[0].request.gpu_count, 1);
  EXPECT_EQ((*jobs)[2].name, "philly-4");
  ASSERT_EQ((*jobs)[2].job.groups.size(), 1u);  // 2 x 8
  EXPECT_EQ((*jobs)[2].job.groups[0].replicas, 2);
  EXPECT_EQ((*jobs)[2].duration, 1);
}

TEST(TimelineTest, HostileRowsAreRefusedNamingLineAndReason) {
  struct Case {
    std::string row;
    std::string error;
  };
  const Case cases[] = {
      {"2017-10-09 07:01:55,66.0,0,0,a\n", ":2: num_gpus must be 1..1024, got 0"},
      {"2017-10-09 07:01:55,66.0,2000,132000,a\n", ":2: num_gpus must be 1..1024"},
      {"2017-10-09 07:01:55,-1,1,-1,a\n", ":2: duration must be 0.."},
      {"2017-10-09 07:01:55,nan,1,1,a\n", ":2: column 'duration' is not a number"},
      {"2017-10-09 07:01:55,1e300,1,1e300,a\n", ":2: duration must be 0.."},
      {"2017-10-09 07:01:55,66.0,2,66.0,a\n", ":2: gpu_time 66.0 is not duration 66.0 x num_gpus 2"},
      {"2017-10-09 07:01:55,66.0,1,66.0,a b\n", ":2: cluster 'a b' is not"},
      {"2017-10-09 07:01:55,66.0,1,66.0,\n", ":2: cluster '' is not"},
      {"2017-10-09 07:01:55,66.0,1,66.0\n", ":2: 4 fields, header has 5"},
      {"yesterday,66.0,1,66.0,a\n", ":2: timestamp 'yesterday' is not"},
      {"2017-10-09 07:01:55,66.0,1,66.0," + std::string(kMaxCsvLineBytes, 'a') + "\n", ":2: line longer than"},
  };
  for (const Case& c : cases) {
    TempFile f("bad.csv", kHeader + c.row);
    auto jobs = ReadPhillyJobs(f.path());
    ASSERT_FALSE(jobs.ok()) << c.row.substr(0, 80);
    EXPECT_NE(jobs.status().message().find(c.error), std::string::npos) << jobs.status().message();
    EXPECT_LT(jobs.status().message().size(), 512u);
  }
  TempFile empty("empty.csv", kHeader);
  EXPECT_FALSE(ReadPhillyJobs(empty.path()).ok());
  TempFile no_column("nocol.csv", "timestamp,duration,cluster\n2017-10-09 07:01:55,1,a\n");
  EXPECT_EQ(ReadPhillyJobs(no_column.path()).status().message(), no_column.path() + ":1: header has no column 'num_gpus'");
  TimedTraceLimits few;
  few.max_jobs = 1;
  TempFile two("two.csv", kHeader + "2017-10-09 07:01:55,1,1,1,a\n2017-10-09 07:01:55,1,1,1,a\n");
  EXPECT_EQ(ReadPhillyJobs(two.path(), 8, few).status().code(), StatusCode::kResourceExhausted);
}

TEST(TimelineTest, ReadsOpenbPodsWithTheirTimes) {
  TempFile f("pods.csv",
             "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
             "scheduled_time\n"
             "p0,12000,16384,1,1000,,LS,Running,100,1100,100\n"
             "p1,6000,12288,1,460,V100M16|V100M32,BE,Failed,50,50,\n"
             "p2,4000,8192,2,500,,BE,Pending,70,170,\n"
             "p3,1000,1024,0,0,,BE,Running,60,90,60\n");
  auto jobs = ReadOpenbTimedPods(f.path());
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 4u);
  EXPECT_EQ((*jobs)[0].name, "p1");
  EXPECT_EQ((*jobs)[0].arrival, 0);
  EXPECT_EQ((*jobs)[0].duration, 1);  // deleted at once: at least a second
  const TaskRequest& r = (*jobs)[0].job.groups[0].request;
  EXPECT_EQ(r.gpu_share.units(), 460);
  EXPECT_EQ(r.gpu_models, (std::vector<std::string>{"V100M16", "V100M32"}));
  EXPECT_EQ((*jobs)[0].job.groups[0].exec.isolation, IsolationMode::kTimeslice);
  EXPECT_EQ((*jobs)[1].name, "p3");
  EXPECT_EQ((*jobs)[1].job.groups[0].exec.isolation, IsolationMode::kExclusive);
  EXPECT_EQ((*jobs)[2].name, "p2");
  EXPECT_EQ((*jobs)[2].job.groups[0].exec.isolation, IsolationMode::kTimeslice);  // 2 x half GPUs
  EXPECT_EQ((*jobs)[3].arrival, 50);
  EXPECT_EQ((*jobs)[3].duration, 1000);
  EXPECT_EQ((*jobs)[3].job.queue, "default");
  for (const TimedJob& j : *jobs) EXPECT_TRUE(ValidateJob(j.job).ok()) << j.name;
  const std::string header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n";
  for (const auto& [row, error] : std::vector<std::pair<std::string, std::string>>{
           {"p,1,1,1,500,100,99\n", ":2: creation_time 100 and deletion_time 99"},
           {"p,1,1,1,500,-1,99\n", ":2: creation_time -1"},
           {"p,1,1,1,500,x,99\n", ":2: column 'creation_time' is not an integer"},
           {"p,1,1,4294967297,500,1,2\n", ":2: cpu_milli and memory_mib must be 0..2^40 and num_gpu 0..1024"}}) {
    TempFile bad("badpods.csv", header + row);
    auto refused = ReadOpenbTimedPods(bad.path());
    ASSERT_FALSE(refused.ok()) << row;
    EXPECT_NE(refused.status().message().find(error), std::string::npos) << refused.status().message();
  }
}

TEST(TimelineTest, ScaleLoadCompressesArrivalsOnly) {
  std::vector<TimedJob> jobs(2);
  jobs[0].arrival = 0;
  jobs[1].arrival = 101;
  jobs[1].duration = 50;
  auto twice = ScaleLoad(jobs, 2.0);
  EXPECT_EQ(twice[1].arrival, 50);
  EXPECT_EQ(twice[1].duration, 50);
  EXPECT_EQ(ScaleLoad(jobs, 0.5)[1].arrival, 202);
}

TEST(TimelineTest, ServerClustersOfTheGivenShape) {
  auto nodes = ServerCluster("8x2,2x3", "P100", GpuCatalog::Builtin());
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 5u);
  EXPECT_EQ((*nodes)[0].name, "s8-0");
  EXPECT_EQ((*nodes)[0].gpus.size(), 8u);
  EXPECT_EQ((*nodes)[4].name, "s2-4");
  EXPECT_EQ((*nodes)[4].cpu.units(), 16000);
  for (const char* bad : {"", "8", "8x", "x2", "0x2", "65x1", "8x0", "8x2,", "8x-1", "8x100001"}) {
    EXPECT_FALSE(ServerCluster(bad, "P100", GpuCatalog::Builtin()).ok()) << bad;
  }
  EXPECT_FALSE(ServerCluster("8x1", "no-such-gpu", GpuCatalog::Builtin()).ok());
}

}  // namespace
}  // namespace gpupool
