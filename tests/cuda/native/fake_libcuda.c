/* A stub libcuda.so.1 for tests/cuda/test_cuda_real_binding.py: just enough driver for cupti-python and
   cuda-bindings to initialise (version from $FAKE_CUDA_VER, device count from $FAKE_CUDA_DEVICES). NOT a driver. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
CUresult cuDriverGetVersion(int *v){ const char *e=getenv("FAKE_CUDA_VER"); *v = e? atoi(e):13000; return 0;}
CUresult cuInit(unsigned f){ (void)f; return 0;}
CUresult cuDeviceGetCount(int *c){ const char *e=getenv("FAKE_CUDA_DEVICES"); *c = e? atoi(e):1; return 0;}
static void *self(void){ static void *h; if(!h){ Dl_info i; dladdr((void*)&cuInit,&i); h=dlopen(i.dli_fname,RTLD_NOW|RTLD_NOLOAD);} return h; }
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status){
  (void)ver;(void)flags; *pfn = dlsym(self(), sym);
  if(status) *status = *pfn ? 0 : 1;
  return *pfn ? 0 : 500; }
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags){ return cuGetProcAddress_v2(sym,pfn,ver,flags,0);}
