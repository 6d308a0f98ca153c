/* A fake Level Zero loader for polyprof-xpu's tests (soname libze_loader.so.1).
 *
 * It answers the calls polyprof-xpu's probe makes (zeInit, zeDriverGet,
 * zeDeviceGet, zeDeviceGetProperties), as told by the environment:
 *   FAKE_ZE_INIT_RESULT  zeInit's result (default 0; 0x78000001 = no driver)
 *   FAKE_ZE_DRIVERS      number of drivers (default 1)
 *   FAKE_ZE_DEVICES      number of GPU devices per driver (default 2)
 * Device i has UUID {0x86, 0x80, i, 0...} and the name "Fake Intel GPU i".
 * Built with -DFAKE_ZE_NO_ZESINIT it lacks zesInit, like Level Zero < 1.9.
 *
 * It also exports every other Level Zero symbol the real Intel PTI backend
 * (libpti.so from the intel-pti wheel) links against, each returning
 * ZE_RESULT_ERROR_UNINITIALIZED, so that the real libpti.so loads against it
 * and the real ptiViewGetNextRecord can walk test buffers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define ZE_UNINITIALIZED 0x78000001u

typedef struct {
  uint32_t stype; void* pNext; uint32_t type; uint32_t vendorId; uint32_t deviceId; uint32_t flags;
  uint32_t subdeviceId; uint32_t coreClockRate; uint64_t maxMemAllocSize; uint32_t maxHardwareContexts;
  uint32_t maxCommandQueuePriority; uint32_t numThreadsPerEU; uint32_t physicalEUSimdWidth;
  uint32_t numEUsPerSubslice; uint32_t numSubslicesPerSlice; uint32_t numSlices; uint64_t timerResolution;
  uint32_t timestampValidBits; uint32_t kernelTimestampValidBits; uint8_t uuid[16]; char name[256];
} ze_device_properties_t;

static long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  return (v && *v) ? strtol(v, NULL, 0) : fallback;
}

static uintptr_t driver_handle(uint32_t i) { return 0x1000u + i; }
static uintptr_t device_handle(uint32_t driver, uint32_t i) { return 0x20000u + driver * 0x100u + i; }

uint32_t zeInit(uint32_t flags) { (void)flags; return (uint32_t)env_long("FAKE_ZE_INIT_RESULT", 0); }
#ifndef FAKE_ZE_NO_ZESINIT
uint32_t zesInit(uint32_t flags) { (void)flags; return (uint32_t)env_long("FAKE_ZE_INIT_RESULT", 0); }
#endif

uint32_t zeDriverGet(uint32_t* count, void** drivers) {
  uint32_t n = (uint32_t)env_long("FAKE_ZE_DRIVERS", 1);
  if (zeInit(0) != 0) return ZE_UNINITIALIZED;
  if (drivers) { for (uint32_t i = 0; i < n && i < *count; i++) drivers[i] = (void*)driver_handle(i); }
  *count = n;
  return 0;
}

uint32_t zeDeviceGet(void* driver, uint32_t* count, void** devices) {
  uint32_t n = (uint32_t)env_long("FAKE_ZE_DEVICES", 2);
  uint32_t d = (uint32_t)((uintptr_t)driver - 0x1000u);
  if (devices) { for (uint32_t i = 0; i < n && i < *count; i++) devices[i] = (void*)device_handle(d, i); }
  *count = n;
  return 0;
}

uint32_t zeDeviceGetProperties(void* device, ze_device_properties_t* p) {
  uint32_t i = (uint32_t)(((uintptr_t)device - 0x20000u) & 0xff);
  p->type = 1; /* GPU */
  p->vendorId = 0x8086;
  p->deviceId = 0x0bd5;
  p->coreClockRate = 1600;
  p->maxMemAllocSize = 1ull << 32;
  memset(p->uuid, 0, sizeof p->uuid);
  p->uuid[0] = 0x86; p->uuid[1] = 0x80; p->uuid[2] = (uint8_t)i;
  snprintf(p->name, sizeof p->name, "Fake Intel GPU %u", i);
  return 0;
}

#define STUB(name) uint32_t name(void) { return ZE_UNINITIALIZED; }
STUB(zeCommandListAppendBarrier) STUB(zeCommandListAppendEventReset) STUB(zeCommandListAppendImageCopy)
STUB(zeCommandListAppendImageCopyFromMemory) STUB(zeCommandListAppendImageCopyRegion)
STUB(zeCommandListAppendImageCopyToMemory) STUB(zeCommandListAppendLaunchCooperativeKernel)
STUB(zeCommandListAppendLaunchKernel) STUB(zeCommandListAppendLaunchKernelIndirect)
STUB(zeCommandListAppendMemoryCopy) STUB(zeCommandListAppendMemoryCopyFromContext)
STUB(zeCommandListAppendMemoryCopyRegion) STUB(zeCommandListAppendMemoryFill)
STUB(zeCommandListAppendMemoryRangesBarrier) STUB(zeCommandListAppendQueryKernelTimestamps)
STUB(zeCommandListAppendSignalEvent) STUB(zeCommandListAppendWaitOnEvents) STUB(zeCommandListClose)
STUB(zeCommandListCreate) STUB(zeCommandListDestroy) STUB(zeContextCreate) STUB(zeContextDestroy)
STUB(zeDeviceCanAccessPeer) STUB(zeDeviceGetGlobalTimestamps) STUB(zeDeviceGetSubDevices)
STUB(zeDevicePciGetPropertiesExt) STUB(zeDriverGetApiVersion) STUB(zeDriverGetExtensionFunctionAddress)
STUB(zeDriverGetExtensionProperties) STUB(zeEventCreate) STUB(zeEventDestroy) STUB(zeEventHostReset)
STUB(zeEventHostSynchronize) STUB(zeEventPoolCreate) STUB(zeEventPoolDestroy) STUB(zeEventQueryKernelTimestamp)
STUB(zeEventQueryStatus) STUB(zeFenceQueryStatus) STUB(zeKernelGetName) STUB(zeKernelGetProperties)
STUB(zeMemAllocHost) STUB(zeMemFree) STUB(zeMemGetAllocProperties) STUB(zelLoaderGetVersions)
STUB(zelTracerCreate) STUB(zelTracerDestroy) STUB(zelTracerSetEnabled)
STUB(zetCommandListAppendMetricQueryBegin) STUB(zetCommandListAppendMetricQueryEnd)
STUB(zetContextActivateMetricGroups) STUB(zetMetricGet) STUB(zetMetricGetProperties)
STUB(zetMetricGroupCalculateMetricValues) STUB(zetMetricGroupCalculateMultipleMetricValuesExp)
STUB(zetMetricGroupGet) STUB(zetMetricGroupGetProperties) STUB(zetMetricQueryCreate) STUB(zetMetricQueryDestroy)
STUB(zetMetricQueryGetData) STUB(zetMetricQueryPoolCreate) STUB(zetMetricQueryPoolDestroy)
STUB(zetMetricQueryReset) STUB(zetMetricStreamerClose) STUB(zetMetricStreamerOpen) STUB(zetMetricStreamerReadData)
