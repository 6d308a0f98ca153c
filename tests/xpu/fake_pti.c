/* A fake Intel PTI (libpti_view) for polyprof-xpu's tests.
 *
 * It exports the PTI View entry points polyprof-xpu calls and delivers
 * records through the real callback path: records queued by the test-only
 * fakePtiAdd* functions (while their view is enabled, as PTI records only
 * then) are written into the buffers the plugin's request callback hands
 * out, laid out as the PTI 1.x (v2) C structs below, and handed back through
 * the plugin's completed callback on ptiFlushAllViews (or from a foreign
 * thread with fakePtiFlushOnThread).
 *
 * ptiViewGetNextRecord forwards to the REAL one of the intel-pti wheel when
 * FAKE_PTI_REAL_LIBRARY names it and its backend loads (counted by
 * fakePtiRealWalks); otherwise this file walks with the PTI 1.2.0 strides
 * (counted by fakePtiOwnWalks).
 *
 * Environment: FAKE_PTI_VERSION ("1.2.0"), FAKE_PTI_NOT_IMPLEMENTED=1 (every
 * call returns 2, as with a backend that did not load), FAKE_PTI_ABORT=1
 * (view calls abort(), as real PTI does with a loader but no driver),
 * FAKE_PTI_REFUSE_KIND=N (ptiViewEnable(N) returns 2), FAKE_PTI_REFUSE_CALLBACKS=1
 * (ptiViewSetCallbacks fails),
 * FAKE_PTI_CLOCK_OFFSET_NS (added to CLOCK_REALTIME in ptiViewGetTimestamp).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint32_t pti_result;
typedef struct { uint32_t _view_kind; } pti_view_record_base;
typedef struct { uint32_t _major, _minor, _patch; } pti_version;
typedef void (*req_fn)(unsigned char**, size_t*);
typedef void (*done_fn)(unsigned char*, size_t, size_t);
typedef uint64_t (*ts_fn)(void);

/* ---- record structs: field order of pti_view.h (PTI 1.0), v2 tails included ---- */
typedef struct {
  pti_view_record_base _view_kind; void* _queue_handle; void* _context_handle; const char* _name;
  const char* _source_file_name; uint64_t _source_line_number; uint64_t _kernel_id; uint32_t _correlation_id;
  uint32_t _thread_id; char _pci_address[16]; uint8_t _device_uuid[16]; uint64_t _append_timestamp;
  uint64_t _start_timestamp; uint64_t _end_timestamp; uint64_t _submit_timestamp;
  uint64_t _sycl_task_begin_timestamp; uint64_t _sycl_enqk_begin_timestamp; uint64_t _sycl_node_id;
  uint64_t _sycl_queue_id; uint32_t _sycl_invocation_id;
  void* _device_handle; uint32_t _engine_ordinal; uint32_t _engine_index;
} rec_kernel;
typedef struct {
  pti_view_record_base _view_kind; uint32_t _memcpy_type; uint32_t _mem_src; uint32_t _mem_dst;
  void* _queue_handle; void* _context_handle; const char* _name; char _pci_address[16]; uint8_t _device_uuid[16];
  uint64_t _mem_op_id; uint32_t _correlation_id; uint32_t _thread_id; uint64_t _append_timestamp;
  uint64_t _start_timestamp; uint64_t _end_timestamp; uint64_t _submit_timestamp; uint64_t _bytes;
  uint64_t _sycl_queue_id;
  void* _device_handle; uint32_t _engine_ordinal; uint32_t _engine_index;
} rec_memcpy;
typedef struct {
  pti_view_record_base _view_kind; uint32_t _memcpy_type; uint32_t _mem_src; uint32_t _mem_dst;
  void* _queue_handle; void* _context_handle; const char* _name; char _src_pci_address[16];
  char _dst_pci_address[16]; uint8_t _src_uuid[16]; uint8_t _dst_uuid[16]; uint64_t _mem_op_id;
  uint32_t _correlation_id; uint32_t _thread_id; uint64_t _append_timestamp; uint64_t _start_timestamp;
  uint64_t _end_timestamp; uint64_t _submit_timestamp; uint64_t _bytes; uint64_t _sycl_queue_id;
  void* _src_device_handle; void* _dst_device_handle; uint32_t _engine_ordinal; uint32_t _engine_index;
} rec_p2p;
typedef struct {
  pti_view_record_base _view_kind; uint32_t _mem_type; void* _queue_handle; void* _context_handle;
  const char* _name; char _pci_address[16]; uint8_t _device_uuid[16]; uint64_t _mem_op_id;
  uint32_t _correlation_id; uint32_t _thread_id; uint64_t _append_timestamp; uint64_t _start_timestamp;
  uint64_t _end_timestamp; uint64_t _submit_timestamp; uint64_t _bytes; uint64_t _value_for_set;
  uint64_t _sycl_queue_id;
  void* _device_handle; uint32_t _engine_ordinal; uint32_t _engine_index;
} rec_memfill;
typedef struct {
  pti_view_record_base _view_kind; uint64_t _start_timestamp; uint64_t _end_timestamp; uint32_t _api_group;
  uint32_t _api_id; uint32_t _process_id; uint32_t _thread_id; uint32_t _correlation_id; uint32_t _return_code;
} rec_api;
typedef struct {
  pti_view_record_base _view_kind; uint32_t _synch_type; void* _context_handle; void* _queue_handle;
  void* _event_handle; uint64_t _start_timestamp; uint64_t _end_timestamp; uint32_t _thread_id;
  uint32_t _correlation_id; uint32_t _number_wait_events; uint32_t _return_code; uint32_t _api_id;
  uint32_t _api_group;
} rec_sync;
typedef struct {
  pti_view_record_base _view_kind; uint64_t _overhead_start_timestamp_ns; uint64_t _overhead_end_timestamp_ns;
  uint32_t _overhead_thread_id; uint32_t _api_id; uint64_t _overhead_count; uint64_t _overhead_duration_ns;
  uint32_t _overhead_kind;
} rec_overhead;
typedef struct {
  pti_view_record_base _view_kind; uint32_t _correlation_id; uint64_t _external_id; uint32_t _external_kind;
} rec_extcorr;

/* sizeof per kind, for tests that compare with the plugin's layouts. */
size_t fakePtiRecordSize(uint32_t kind) {
  switch (kind) {
    case 1: return sizeof(rec_kernel); case 3: case 6: return sizeof(rec_api); case 5: return sizeof(rec_overhead);
    case 7: return sizeof(rec_extcorr); case 8: return sizeof(rec_memcpy); case 9: return sizeof(rec_memfill);
    case 10: return sizeof(rec_p2p); case 11: return sizeof(rec_sync); default: return 0;
  }
}

/* ---- state ---- */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static req_fn on_request; static done_fn on_done; static ts_fn user_clock;
static int enabled[16];
static unsigned char* queue_bytes; static size_t queue_len, queue_cap;
static unsigned char* cur_buf; static size_t cur_size, cur_used;
static long real_walks, own_walks, dropped_disabled, dropped_no_buffer, buffers_delivered;

static long env_long(const char* name, long fallback) {
  const char* v = getenv(name); return (v && *v) ? strtol(v, NULL, 0) : fallback;
}
static int not_implemented(void) { return env_long("FAKE_PTI_NOT_IMPLEMENTED", 0) != 0; }
static void maybe_abort(const char* where) {
  if (env_long("FAKE_PTI_ABORT", 0)) {
    fprintf(stderr, "fake PTI: %s without a driver: abort (as PTI does)\n", where);
    abort();
  }
}

static void queue_record(const void* rec, size_t size, int force) {
  uint32_t kind = ((const pti_view_record_base*)rec)->_view_kind;
  pthread_mutex_lock(&lock);
  if (!force && (kind >= 16 || !enabled[kind])) { dropped_disabled++; pthread_mutex_unlock(&lock); return; }
  if (queue_len + size > queue_cap) {
    queue_cap = (queue_len + size) * 2 + 4096;
    queue_bytes = realloc(queue_bytes, queue_cap);
  }
  memcpy(queue_bytes + queue_len, rec, size);
  queue_len += size;
  pthread_mutex_unlock(&lock);
}

/* ---- test-only API ---- */
void fakePtiReset(void) {
  pthread_mutex_lock(&lock);
  queue_len = 0; real_walks = own_walks = dropped_disabled = dropped_no_buffer = buffers_delivered = 0;
  pthread_mutex_unlock(&lock);
}
long fakePtiCounter(const char* name) {
  if (!strcmp(name, "real_walks")) return real_walks;
  if (!strcmp(name, "own_walks")) return own_walks;
  if (!strcmp(name, "dropped_disabled")) return dropped_disabled;
  if (!strcmp(name, "dropped_no_buffer")) return dropped_no_buffer;
  if (!strcmp(name, "buffers_delivered")) return buffers_delivered;
  if (!strcmp(name, "queued_bytes")) return (long)queue_len;
  return -1;
}
int fakePtiEnabled(uint32_t kind) { return kind < 16 ? enabled[kind] : 0; }

void fakePtiAddKernel(uint64_t start, uint64_t end, uint32_t corr, uint32_t tid, const uint8_t* uuid,
                      uint64_t sycl_queue, uint64_t queue_handle, const char* name, uint64_t kernel_id) {
  rec_kernel r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 1; r._queue_handle = (void*)queue_handle; r._context_handle = (void*)0xc0;
  r._name = name; r._kernel_id = kernel_id; r._correlation_id = corr; r._thread_id = tid;
  memcpy(r._device_uuid, uuid, 16); snprintf(r._pci_address, 16, "0000:%02x:00.0", uuid[2]);
  r._append_timestamp = start - 100; r._submit_timestamp = start - 50; r._start_timestamp = start;
  r._end_timestamp = end; r._sycl_queue_id = sycl_queue; r._sycl_node_id = 7; r._sycl_invocation_id = 3;
  r._engine_ordinal = 1; r._engine_index = 2;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddMemcpy(uint64_t start, uint64_t end, uint32_t corr, uint32_t tid, const uint8_t* uuid,
                      uint64_t sycl_queue, uint64_t queue_handle, uint32_t type, uint32_t src, uint32_t dst,
                      uint64_t bytes) {
  rec_memcpy r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 8; r._memcpy_type = type; r._mem_src = src; r._mem_dst = dst;
  r._queue_handle = (void*)queue_handle; r._context_handle = (void*)0xc0; r._name = "zeCommandListAppendMemoryCopy";
  memcpy(r._device_uuid, uuid, 16); r._correlation_id = corr; r._thread_id = tid; r._start_timestamp = start;
  r._end_timestamp = end; r._append_timestamp = start - 10; r._submit_timestamp = start - 5; r._bytes = bytes;
  r._sycl_queue_id = sycl_queue; r._mem_op_id = 99;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddMemcpyP2P(uint64_t start, uint64_t end, uint32_t corr, uint32_t tid, const uint8_t* src_uuid,
                         const uint8_t* dst_uuid, uint64_t sycl_queue, uint64_t queue_handle, uint64_t bytes) {
  rec_p2p r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 10; r._memcpy_type = 10; r._mem_src = 2; r._mem_dst = 2;
  r._queue_handle = (void*)queue_handle; r._context_handle = (void*)0xc0; r._name = "zeCommandListAppendMemoryCopy";
  memcpy(r._src_uuid, src_uuid, 16); memcpy(r._dst_uuid, dst_uuid, 16); r._correlation_id = corr;
  r._thread_id = tid; r._start_timestamp = start; r._end_timestamp = end; r._bytes = bytes;
  r._sycl_queue_id = sycl_queue;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddMemfill(uint64_t start, uint64_t end, uint32_t corr, uint32_t tid, const uint8_t* uuid,
                       uint64_t sycl_queue, uint64_t queue_handle, uint32_t mem_type, uint64_t bytes,
                       uint64_t value) {
  rec_memfill r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 9; r._mem_type = mem_type; r._queue_handle = (void*)queue_handle;
  r._context_handle = (void*)0xc0; r._name = "zeCommandListAppendMemoryFill"; memcpy(r._device_uuid, uuid, 16);
  r._correlation_id = corr; r._thread_id = tid; r._start_timestamp = start; r._end_timestamp = end;
  r._bytes = bytes; r._value_for_set = value; r._sycl_queue_id = sycl_queue;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddApi(uint32_t kind, uint64_t start, uint64_t end, uint32_t group, uint32_t api_id, uint32_t pid,
                   uint32_t tid, uint32_t corr) {
  rec_api r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = kind; r._start_timestamp = start; r._end_timestamp = end; r._api_group = group;
  r._api_id = api_id; r._process_id = pid; r._thread_id = tid; r._correlation_id = corr;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddSync(uint64_t start, uint64_t end, uint32_t sync_type, uint32_t tid, uint32_t corr,
                    uint64_t queue_handle, uint32_t api_id, uint32_t waits) {
  rec_sync r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 11; r._synch_type = sync_type; r._queue_handle = (void*)queue_handle;
  r._start_timestamp = start; r._end_timestamp = end; r._thread_id = tid; r._correlation_id = corr;
  r._number_wait_events = waits; r._api_id = api_id; r._api_group = 1;
  queue_record(&r, sizeof r, 0);
}
void fakePtiAddOverhead(uint64_t start, uint64_t end, uint32_t tid, uint32_t kind, uint64_t count, uint64_t dur) {
  rec_overhead r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 5; r._overhead_start_timestamp_ns = start; r._overhead_end_timestamp_ns = end;
  r._overhead_thread_id = tid; r._overhead_kind = kind; r._overhead_count = count; r._overhead_duration_ns = dur;
  queue_record(&r, sizeof r, 0);
}
/* Delivered whether or not its view is on (polyprof does not enable it; another client of PTI may). */
void fakePtiAddExternalCorrelation(uint32_t corr, uint64_t external_id, uint32_t external_kind) {
  rec_extcorr r; memset(&r, 0, sizeof r);
  r._view_kind._view_kind = 7; r._correlation_id = corr; r._external_id = external_id;
  r._external_kind = external_kind;
  queue_record(&r, sizeof r, 1);
}
/* Enable every view without callbacks, for tests that only build buffers. */
void fakePtiEnableAllForBuilding(void) { for (int i = 0; i < 16; i++) enabled[i] = 1; }
/* Between tests: no view stays on from a test that built buffers with every view enabled. */
void fakePtiDisableAll(void) { for (int i = 0; i < 16; i++) enabled[i] = 0; }
/* Copy every queued record, back to back, into out; returns the bytes written and empties the queue. */
size_t fakePtiBuildBuffer(unsigned char* out, size_t cap) {
  pthread_mutex_lock(&lock);
  size_t n = queue_len < cap ? queue_len : cap;
  memcpy(out, queue_bytes, n);
  queue_len = 0;
  pthread_mutex_unlock(&lock);
  return n;
}

/* ---- the PTI View API ---- */
pti_version ptiVersion(void) {
  pti_version v = {1, 2, 0};
  const char* s = getenv("FAKE_PTI_VERSION");
  if (s && *s) sscanf(s, "%u.%u.%u", &v._major, &v._minor, &v._patch);
  return v;
}
const char* ptiVersionString(void) { return "1.2.0-fake"; }

static const char* l0_names[] = {"zeInit", "zeCommandListAppendLaunchKernel", "zeCommandListAppendMemoryCopy",
                                 "zeCommandListAppendMemoryFill", "zeEventHostSynchronize",
                                 "zeCommandListAppendBarrier"};
static const char* sycl_names[] = {"urEnqueueKernelLaunch", "urEnqueueUSMMemcpy", "urEnqueueUSMFill"};

pti_result ptiViewGetApiIdName(uint32_t group, uint32_t id, const char** name) {
  if (not_implemented()) return 2;
  if (!name) return 3;
  if (group == 1 && id < sizeof l0_names / sizeof *l0_names) { *name = l0_names[id]; return 0; }
  if (group == 3 && id < sizeof sycl_names / sizeof *sycl_names) { *name = sycl_names[id]; return 0; }
  return 7;
}

pti_result ptiViewSetCallbacks(req_fn req, done_fn done) {
  if (not_implemented()) return 2;
  maybe_abort("ptiViewSetCallbacks");
  if (env_long("FAKE_PTI_REFUSE_CALLBACKS", 0)) return 1;  /* PTI_ERROR_... as a refusing backend */
  if (!req || !done) return 3;
  unsigned char* buf = NULL; size_t size = 0;
  req(&buf, &size);                      /* validated synchronously, as PTI does */
  if (!buf || size < 192) { if (buf) done(buf, size, 0); return 3; }
  pthread_mutex_lock(&lock);
  if (cur_buf && on_done) { unsigned char* old = cur_buf; cur_buf = NULL; pthread_mutex_unlock(&lock); on_done(old, cur_size, 0); pthread_mutex_lock(&lock); }
  on_request = req; on_done = done; cur_buf = buf; cur_size = size; cur_used = 0;
  pthread_mutex_unlock(&lock);
  return 0;
}

pti_result ptiViewEnable(uint32_t kind) {
  if (not_implemented()) return 2;
  maybe_abort("ptiViewEnable");
  if (!on_request) return 4;
  if (kind == 0 || kind == 2 || kind == 4 || kind > 12) return 3;
  if (env_long("FAKE_PTI_REFUSE_KIND", -1) == (long)kind) return 2;
  enabled[kind] = 1;
  return 0;
}
pti_result ptiViewDisable(uint32_t kind) {
  if (not_implemented()) return 2;
  if (kind >= 16) return 3;
  enabled[kind] = 0;
  return 0;
}
pti_result ptiViewEnableRuntimeApiClass(uint32_t enable, uint32_t cls, uint32_t group) {
  (void)enable; (void)cls; (void)group; return not_implemented() ? 2 : 0;
}
pti_result ptiViewEnableDriverApiClass(uint32_t enable, uint32_t cls, uint32_t group) {
  (void)enable; (void)cls; (void)group; return not_implemented() ? 2 : 0;
}
pti_result ptiViewGPULocalAvailable(void) { return not_implemented() ? 2 : 0; }

static size_t stride_of(uint32_t kind) {       /* PTI 1.2.0 kViewSizeLookupTable */
  static const size_t table[13] = {0, 184, 0, 48, 0, 56, 48, 24, 152, 152, 192, 72, 64};
  return kind < 13 ? table[kind] : 0;
}

/* Hands records to the plugin: fills buffers from the request callback, returns them full. */
pti_result ptiFlushAllViews(void) {
  if (not_implemented()) return 2;
  maybe_abort("ptiFlushAllViews");
  if (!on_request || !on_done) return 4;
  pthread_mutex_lock(&lock);
  size_t pos = 0;
  while (pos < queue_len) {
    uint32_t kind = ((pti_view_record_base*)(queue_bytes + pos))->_view_kind;
    size_t size = stride_of(kind);
    if (!cur_buf) {
      pthread_mutex_unlock(&lock); on_request(&cur_buf, &cur_size); pthread_mutex_lock(&lock);
      cur_used = 0;
      if (!cur_buf) { dropped_no_buffer++; pos += size; continue; }
    }
    if (cur_used + size > cur_size) {
      unsigned char* full = cur_buf; size_t full_size = cur_size, used = cur_used;
      cur_buf = NULL; buffers_delivered++;
      pthread_mutex_unlock(&lock); on_done(full, full_size, used); pthread_mutex_lock(&lock);
      continue;
    }
    memcpy(cur_buf + cur_used, queue_bytes + pos, size);
    cur_used += size; pos += size;
  }
  queue_len = 0;
  if (cur_buf && cur_used) {
    unsigned char* full = cur_buf; size_t full_size = cur_size, used = cur_used;
    cur_buf = NULL; buffers_delivered++;
    pthread_mutex_unlock(&lock); on_done(full, full_size, used); pthread_mutex_lock(&lock);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static void* flush_thread(void* arg) { (void)arg; ptiFlushAllViews(); return NULL; }
/* Deliver from a thread that is not Python's, as PTI's own threads do. */
int fakePtiFlushOnThread(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, flush_thread, NULL)) return -1;
  return pthread_join(t, NULL);
}

uint64_t ptiViewGetTimestamp(void) {
  if (not_implemented()) return 0;
  maybe_abort("ptiViewGetTimestamp");
  if (user_clock) return user_clock();
  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)env_long("FAKE_PTI_CLOCK_OFFSET_NS", 0);
}
pti_result ptiViewSetTimestampCallback(ts_fn fn) { if (!fn) return 3; user_clock = fn; return 0; }

/* ---- ptiViewGetNextRecord: the real one when it can be used, else PTI 1.2.0's strides ---- */
typedef pti_result (*next_fn)(uint8_t*, size_t, pti_view_record_base**);
static next_fn real_next; static int real_tried;

static pti_result own_next(uint8_t* buffer, size_t valid, pti_view_record_base** record) {
  if (!buffer || !valid) return 1;
  if (!record) return 3;
  if (!*record) { *record = (pti_view_record_base*)buffer; return 0; }
  size_t stride = stride_of((*record)->_view_kind);
  if (!stride) return 3;
  uint8_t* next = (uint8_t*)*record + stride;
  if (next >= buffer + valid) return 1;
  *record = (pti_view_record_base*)next;
  return 0;
}

pti_result ptiViewGetNextRecord(uint8_t* buffer, size_t valid, pti_view_record_base** record) {
  if (!real_tried) {
    real_tried = 1;
    const char* path = getenv("FAKE_PTI_REAL_LIBRARY");
    if (path && *path) {
      void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) real_next = (next_fn)dlsym(h, "ptiViewGetNextRecord");
    }
  }
  if (real_next) {
    pti_view_record_base* before = *record;
    pti_result rc = real_next(buffer, valid, record);
    if (rc != 2) { __atomic_add_fetch(&real_walks, 1, __ATOMIC_RELAXED); return rc; }
    *record = before;                       /* its backend did not load: walk ourselves */
  }
  __atomic_add_fetch(&own_walks, 1, __ATOMIC_RELAXED);
  return own_next(buffer, valid, record);
}
