// MIG management through NVML (nvml_mig.cc) against the fake libnvidia-ml.so.1 of tests/fake_nvml,
// whose MIG geometry checks are tested here too.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "agent/nvml.h"

namespace gpupool {
namespace {

class MigConfig {
 public:
  explicit MigConfig(const std::string& text) {
    path_ = std::filesystem::temp_directory_path() /
            ("gpupool_fake_nvml_mig_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".conf");
    std::ofstream(path_) << text;
    ::setenv("GPUPOOL_FAKE_NVML", path_.c_str(), 1);
  }
  ~MigConfig() {
    ::unsetenv("GPUPOOL_FAKE_NVML");
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  MigConfig(const MigConfig&) = delete;
  MigConfig& operator=(const MigConfig&) = delete;

 private:
  std::filesystem::path path_;
};

std::unique_ptr<Nvml> Load(const char* path = FAKE_NVML_PATH) {
  auto nvml = Nvml::Load(path);
  EXPECT_TRUE(nvml.ok()) << nvml.status().ToString();
  return nvml.ok() ? std::move(nvml).value() : nullptr;
}

// "profileId@start" of GPU `gpu`'s instances, in discovery order.
std::string Layout(Nvml& nvml, int gpu) {
  auto inv = nvml.Discover();
  EXPECT_TRUE(inv.ok()) << inv.status().ToString();
  if (!inv.ok()) return "?";
  std::string out;
  for (const MigInstanceInfo& m : inv->gpus[static_cast<size_t>(gpu)].mig_instances)
    out += (out.empty() ? "" : ",") + std::to_string(m.profile_id) + "@" + std::to_string(m.start);
  return out;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The fake's own count of instances created or destroyed (not NVML).
long MigChanges() {
  void* lib = dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return -1;
  auto fn = reinterpret_cast<long (*)()>(dlsym(lib, "fake_nvml_mig_changes"));
  const long n = fn != nullptr ? fn() : -1;
  dlclose(lib);
  return n;
}

TEST(NvmlMig, CreateAndDestroyAreVisibleToDiscovery) {
  MigConfig config("gpus=2\nname=NVIDIA A100-SXM4-80GB\nmemory_mib=81920\ncc=8.0\nmig=1\n"
                   "mig_instances.1=19@4,19@5,19@6,19@7\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Layout(*nvml, 1), "19@4,19@5,19@6,19@7");
  for (int gi = 1; gi <= 4; ++gi) {
    Status st = nvml->DestroyMigGpuInstance(1, gi);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(Layout(*nvml, 1), "");
  auto created = nvml->CreateMigInstance(1, 9, 4);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->profile_id, 9);
  EXPECT_EQ(created->start, 4);
  EXPECT_EQ(created->size, 4);
  EXPECT_EQ(created->gpu_instance_id, 1);  // the lowest free id
  EXPECT_EQ(created->compute_instance_id, 0);
  // A UUID of its own, not the one the destroyed 1g instance with GPU instance id 1 had.
  EXPECT_EQ(created->uuid, "MIG-fa6e0001-0001-4000-8001-000000000000");
  auto inv = nvml->Discover();
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ(inv->gpus[1].mig_instances.size(), 1u);
  const MigInstanceInfo& seen = inv->gpus[1].mig_instances[0];
  EXPECT_EQ(seen.uuid, created->uuid);
  EXPECT_EQ(seen.profile, "3g.40gb");
  EXPECT_EQ(seen.start, 4);
  EXPECT_EQ(seen.size, 4);
  EXPECT_EQ(MigLayoutJson(inv->gpus[1]).dump(), R"([{"profileId":9,"start":4}])");
  // A 4g beside it fills the GPU: 4 + 3 compute slices.
  ASSERT_TRUE(nvml->CreateMigInstance(1, 5, 0).ok());
  EXPECT_EQ(Layout(*nvml, 1), "9@4,5@0");
  inv = nvml->Discover();
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(MigLayoutJson(inv->gpus[1]).dump(), R"([{"profileId":5,"start":0},{"profileId":9,"start":4}])");
}

TEST(NvmlMig, OverlapIsRefusedByTheDriver) {
  MigConfig config("gpus=2\nmig=1\nmig_instances.1=9@4\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  auto r = nvml->CreateMigInstance(1, 19, 5);  // slice 5 lies inside the 3g at 4..7
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_TRUE(Has(msg, "nvmlDeviceCreateGpuInstanceWithPlacement")) << msg;
  EXPECT_TRUE(Has(msg, "GPU 1")) << msg;
  EXPECT_TRUE(Has(msg, "profile 1g.10gb (id 19)")) << msg;
  EXPECT_TRUE(Has(msg, "start 5")) << msg;
  EXPECT_TRUE(Has(msg, "Insufficient resources (NVML error 23)")) << msg;
  // Two 3g fill the memory slices; the second one at 4 overlaps.
  EXPECT_FALSE(nvml->CreateMigInstance(1, 9, 4).ok());
  EXPECT_TRUE(nvml->CreateMigInstance(1, 9, 0).ok());
  EXPECT_EQ(Layout(*nvml, 1), "9@4,9@0");
}

TEST(NvmlMig, InstanceCountsAndComputeSlicesAreLimited) {
  MigConfig config("gpus=1\nmig=0\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  ASSERT_TRUE(nvml->CreateMigInstance(0, 20, 0).ok());  // 1g+me: one media engine set per GPU
  auto second = nvml->CreateMigInstance(0, 20, 1);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(Has(second.status().message(), "Insufficient resources")) << second.status().message();
  // 4g at 0 overlaps the +me instance at 0; 2g + 2g + 3g fit beside it only where slices are free.
  EXPECT_FALSE(nvml->CreateMigInstance(0, 5, 0).ok());
  ASSERT_TRUE(nvml->CreateMigInstance(0, 14, 2).ok());
  ASSERT_TRUE(nvml->CreateMigInstance(0, 9, 4).ok());
  EXPECT_EQ(Layout(*nvml, 0), "20@0,14@2,9@4");  // 1 + 2 + 3 compute slices
}

TEST(NvmlMig, InvalidStartOrProfileIsRefusedWithTheValidStarts) {
  MigConfig config("gpus=2\nmig=1\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  auto bad_start = nvml->CreateMigInstance(1, 9, 2);
  ASSERT_FALSE(bad_start.ok());
  EXPECT_EQ(bad_start.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(bad_start.status().message(), "starts: 0, 4")) << bad_start.status().message();
  auto out_of_range = nvml->CreateMigInstance(1, 9, 9);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  auto unknown = nvml->CreateMigInstance(1, 42, 0);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(Has(unknown.status().message(), "no GPU-instance profile with id 42")) << unknown.status().message();
  auto no_gpu = nvml->CreateMigInstance(7, 19, 0);
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_TRUE(Has(no_gpu.status().message(), "GPU 7 does not exist")) << no_gpu.status().message();
  auto not_mig = nvml->CreateMigInstance(0, 19, 0);
  ASSERT_FALSE(not_mig.ok());
  EXPECT_TRUE(Has(not_mig.status().message(), "not in MIG mode")) << not_mig.status().message();
  EXPECT_EQ(MigChanges(), 0);
  EXPECT_EQ(Layout(*nvml, 1), "");
}

TEST(NvmlMig, DestroyingAGpuInstanceWithComputeInstancesIsInUse) {
  MigConfig config("gpus=2\nmig=1\nmig_instances.1=14@0\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  void* lib = dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  using HandleFn = int (*)(unsigned, void**);
  using GiByIdFn = int (*)(void*, unsigned, void**);
  using GiDestroyFn = int (*)(void*);
  auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto by_id = reinterpret_cast<GiByIdFn>(dlsym(lib, "nvmlDeviceGetGpuInstanceById"));
  auto destroy = reinterpret_cast<GiDestroyFn>(dlsym(lib, "nvmlGpuInstanceDestroy"));
  ASSERT_TRUE(handle != nullptr && by_id != nullptr && destroy != nullptr);
  void* dev = nullptr;
  void* gi = nullptr;
  ASSERT_EQ(handle(1, &dev), 0);
  ASSERT_EQ(by_id(dev, 1, &gi), 0);
  EXPECT_EQ(destroy(gi), 19);  // NVML_ERROR_IN_USE: its compute instance is still there
  dlclose(lib);
  EXPECT_EQ(Layout(*nvml, 1), "14@0");
  // The wrapper destroys the compute instances first.
  Status st = nvml->DestroyMigGpuInstance(1, 1);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Layout(*nvml, 1), "");
  Status gone = nvml->DestroyMigGpuInstance(1, 1);
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(Has(gone.message(), "nvmlDeviceGetGpuInstanceById(GPU 1, GPU instance 1): Not Found")) << gone.message();
}

TEST(NvmlMig, AGpuInstanceWithAProcessIsInUse) {
  MigConfig config("gpus=2\nmig=1\nmig_instances.1=19@4,19@5\nmig_busy.1=5\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  auto inv = nvml->Discover();
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ(inv->gpus[1].processes.size(), 1u);
  EXPECT_EQ(inv->gpus[1].processes[0].pid, 5002u);
  EXPECT_EQ(inv->gpus[1].processes[0].gpu_instance_id, 2);
  Status st = nvml->DestroyMigGpuInstance(1, 2);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Has(st.message(), "nvmlComputeInstanceDestroy(GPU 1, GPU instance 2 (profile id 19, start 5))"))
      << st.message();
  EXPECT_TRUE(Has(st.message(), "In use by another client (NVML error 19)")) << st.message();
  EXPECT_TRUE(nvml->DestroyMigGpuInstance(1, 1).ok());
  EXPECT_EQ(Layout(*nvml, 1), "19@5");
}

TEST(NvmlMig, AFailedComputeInstanceLeavesNoGpuInstanceBehind) {
  MigConfig config("gpus=2\nmig=1\nmig_instances.1=19@0\nmig_ci_create_fail=1\n");
  auto nvml = Load();
  ASSERT_NE(nvml, nullptr);
  auto r = nvml->CreateMigInstance(1, 9, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Has(r.status().message(), "nvmlGpuInstanceCreateComputeInstance(GPU 1, profile 3g.40gb (id 9), start 4"))
      << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), "Unknown Error (NVML error 999)")) << r.status().message();
  EXPECT_EQ(Layout(*nvml, 1), "19@0");
  EXPECT_TRUE(nvml->CreateMigInstance(1, 9, 4).ok());  // the injected failure was for one call
}

TEST(NvmlMig, TheMinimalLibraryCannotManageMig) {
  MigConfig config("mig=0\n");
  auto nvml = Load(FAKE_NVML_MINIMAL_PATH);
  ASSERT_NE(nvml, nullptr);
  auto r = nvml->CreateMigInstance(0, 19, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(r.status().message(), "lacks")) << r.status().message();
}

}  // namespace
}  // namespace gpupool
