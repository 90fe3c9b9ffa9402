// gpupool's own minimal declarations of the CUDA driver API's C ABI, shared by the limiter
// (preload.cc), the fake driver (tests/fake_cuda) and the programs that drive it. No NVIDIA header
// exists on the build machines; only the types, constants and struct prefixes these files touch are
// declared, in the order and widths the driver's ABI uses (x86-64 and aarch64 Linux, LP64).
#ifndef GPUPOOL_CUDA_LIMITER_CUDA_ABI_H_
#define GPUPOOL_CUDA_LIMITER_CUDA_ABI_H_

#include <cstddef>
#include <cstdint>

extern "C" {

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;  // NOLINT: the ABI's type
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUfunc_st* CUfunction;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUgraphExec_st* CUgraphExec;

// CUmemLocation and the leading fields of CUmemAllocationProp (cuMemCreate reads the rest; so do
// we not).
typedef struct {
  int type;  // CUmemLocationType: 1 = a device
  int id;    // the device ordinal when type is 1
} CUmemLocation;
typedef struct {
  int type;                  // CUmemAllocationType: 1 = pinned
  int requestedHandleTypes;  // CUmemAllocationHandleType
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;  // NOLINT: the ABI's type
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

// cuLaunchKernelEx's configuration: the launch's geometry, then its stream.
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
} CUlaunchConfig;

// NVML's memory reports (nvmlDeviceGetMemoryInfo and _v2) and PCI location (_v3).
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;  // NOLINT: the ABI's type
} nvmlMemory_t;
typedef struct {
  unsigned version;
  unsigned long long total, reserved, free, used;  // NOLINT: the ABI's type
} nvmlMemory_v2_t;
typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

// The entry points the limiter wraps, the fake driver implements and the probe calls, with the
// driver's own names and signatures. Nothing here is defined by linking libcuda: the limiter only
// defines its wrappers and reaches the driver through dlopen.
CUresult cuInit(unsigned flags);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             int* symbolStatus);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device);
CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned flags, CUdevice device);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext* ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice* device);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc(unsigned* dptr, unsigned bytesize);  // the 32-bit legacy entry point
CUresult cuMemAllocPitch(unsigned* dptr, unsigned* pitch, unsigned width, unsigned height, unsigned element);
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t widthInBytes, size_t height,
                            unsigned elementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned flags);
CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags);  // NOLINT: the ABI's type
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemGetInfo_v2(size_t* free, size_t* total);
CUresult cuStreamCreate(CUstream* stream, unsigned flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamIsCapturing(CUstream stream, int* captureStatus);
CUresult cuThreadExchangeStreamCaptureMode(int* mode);
CUresult cuEventCreate(CUevent* event, unsigned flags);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventQuery(CUevent event);
CUresult cuEventSynchronize(CUevent event);
CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
                        unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ, unsigned sharedMemBytes,
                        CUstream stream, void** kernelParams, void** extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
                             unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
                             unsigned sharedMemBytes, CUstream stream, void** kernelParams, void** extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
                                   unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
                                   unsigned sharedMemBytes, CUstream stream, void** kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
                                        unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
                                        unsigned sharedMemBytes, CUstream stream, void** kernelParams);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci);

}  // extern "C"

namespace gpupool::cuda_abi {

constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorNotInitialized = 3;
constexpr CUresult kErrorInvalidDevice = 101;
constexpr CUresult kErrorInvalidContext = 201;
constexpr CUresult kErrorInvalidHandle = 400;
constexpr CUresult kErrorNotFound = 500;
constexpr CUresult kErrorNotReady = 600;
constexpr CUresult kErrorNotSupported = 801;
constexpr CUresult kErrorUnknown = 999;

constexpr int kMemLocationDevice = 1;                  // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kStreamCaptureStatusNone = 0;            // CU_STREAM_CAPTURE_STATUS_NONE
constexpr int kStreamCaptureModeRelaxed = 2;           // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr cuuint64_t kProcAddressPerThreadStream = 2;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
constexpr int kProcAddressSuccess = 0;                 // CU_GET_PROC_ADDRESS_SUCCESS
constexpr int kProcAddressSymbolNotFound = 1;          // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
constexpr int kAttributePciBusId = 33;                 // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
constexpr int kAttributePciDeviceId = 34;              // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
constexpr int kAttributePciDomainId = 50;              // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID

constexpr int kNvmlSuccess = 0;
constexpr int kNvmlErrorUninitialized = 1;

}  // namespace gpupool::cuda_abi

#endif  // GPUPOOL_CUDA_LIMITER_CUDA_ABI_H_
