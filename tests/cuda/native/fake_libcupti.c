/* A test double for libcupti.so.13, for tests/cuda/test_cuda_real_binding.py. NOT CUPTI: never ship it.

   Exports the CUPTI calls polyprof-cuda makes through cupti-python, with CUPTI's C signatures, so
   cupti-python's own trampolines run unchanged above it. It keeps the buffer callbacks they register,
   logs what it is asked (fake_call_log), and on cuptiActivityFlushAll hands queued records to them in
   buffers obtained from the request callback, walked with cuptiActivityGetNextRecord. Records are
   queued by the test (fake_queue) in CUPTI's own layout, built with cupti-python's numpy dtypes.
   Like CUPTI it drops records of kinds that are not enabled and API calls switched off per cbid, and
   stamps API records with the calling thread's id in the chosen flavour (gettid for SYSTEM). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int CUptiResult;
enum { OK = 0, ERR_INVALID_PARAMETER = 1, ERR_MAX_LIMIT_REACHED = 12, ERR_QUEUE_EMPTY = 18,
       ERR_MULTIPLE_SUBSCRIBERS = 39 };
enum { KIND_DRIVER = 4, KIND_RUNTIME = 5, MAX_KIND = 128, MAX_CBID = 4096 };

typedef void (*RequestFn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*CompleteFn)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);

typedef struct {
  size_t struct_size;
  const char *subscriber_name;
  char *old_subscriber_name;
  size_t old_subscriber_size;
  uint8_t allow_multiple;
  uint8_t padding[7];
} SubscriberParams;

typedef struct Rec { struct Rec *next; size_t size; uint8_t bytes[]; } Rec;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static RequestFn on_request;
static CompleteFn on_complete;
static int enabled[MAX_KIND];
static uint8_t api_off[2][MAX_CBID];       /* [driver, runtime][cbid]: 1 = switched off */
static size_t kind_size[MAX_KIND];
static Rec *head, *tail;
static int thread_id_type;                 /* 0 default (pthread id), 1 system (gettid) */
static int subscribed;
static char other_subscriber[64];
static size_t dropped;
static uint64_t ext_stack[64];
static int ext_depth;
static char call_log[1 << 16];
static size_t log_len;
static long delivery_tids[64];
static int n_deliveries;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
  va_list ap; va_start(ap, fmt);
  if (log_len < sizeof call_log - 128) {
    log_len += (size_t)vsnprintf(call_log + log_len, sizeof call_log - log_len, fmt, ap);
    call_log[log_len++] = '\n'; call_log[log_len] = 0;
  }
  va_end(ap);
}

static size_t aligned(size_t n) { return (n + 7) & ~(size_t)7; }

/* ------------------------------------------------------------ CUPTI API */

CUptiResult cuptiGetVersion(uint32_t *v) { *v = 130004; return OK; }
CUptiResult cuptiGetLastError(void) { return OK; }
CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
  static const char *names[] = {[0] = "CUPTI_SUCCESS", [1] = "CUPTI_ERROR_INVALID_PARAMETER",
    [12] = "CUPTI_ERROR_MAX_LIMIT_REACHED", [18] = "CUPTI_ERROR_QUEUE_EMPTY",
    [39] = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"};
  *s = (r >= 0 && r < 40 && names[r]) ? names[r] : "CUPTI_ERROR_UNKNOWN";
  return OK;
}
CUptiResult cuptiGetTimestamp(uint64_t *t) {
  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
  *t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec; return OK;
}
CUptiResult cuptiSetThreadIdType(int type) { thread_id_type = type; note("thread_id_type %d", type); return OK; }
CUptiResult cuptiGetThreadIdType(int *type) { *type = thread_id_type; return OK; }

static CUptiResult subscribe(void **handle, const char *name, SubscriberParams *p) {
  pthread_mutex_lock(&mu);
  CUptiResult r = OK;
  if (subscribed || other_subscriber[0]) {
    if (p && p->old_subscriber_name && p->old_subscriber_size && other_subscriber[0])
      snprintf(p->old_subscriber_name, p->old_subscriber_size, "%s", other_subscriber);
    r = ERR_MULTIPLE_SUBSCRIBERS;
  } else {
    subscribed = 1; *handle = (void *)&subscribed;
  }
  note("subscribe %s -> %d", name ? name : "(unnamed)", r);
  pthread_mutex_unlock(&mu);
  return r;
}
CUptiResult cuptiSubscribe(void **handle, void *cb, void *user) { (void)cb; (void)user; return subscribe(handle, 0, 0); }
CUptiResult cuptiSubscribe_v2(void **handle, void *cb, void *user, SubscriberParams *p) {
  (void)cb; (void)user;
  if (p && p->struct_size < 40) return ERR_INVALID_PARAMETER;
  return subscribe(handle, p ? p->subscriber_name : 0, p);
}
CUptiResult cuptiUnsubscribe(void *handle) {
  if (handle != (void *)&subscribed) return ERR_INVALID_PARAMETER;
  subscribed = 0; note("unsubscribe"); return OK;
}
CUptiResult cuptiFinalize(void) { note("finalize"); return OK; }
CUptiResult cuptiEnableCallback(uint32_t e, void *s, int d, uint32_t c) { (void)e; (void)s; (void)d; (void)c; return OK; }

CUptiResult cuptiActivityRegisterCallbacks(RequestFn req, CompleteFn done) {
  if (!req || !done) return ERR_INVALID_PARAMETER;
  on_request = req; on_complete = done; note("register_callbacks"); return OK;
}
CUptiResult cuptiActivityEnable(int kind) {
  if (kind <= 0 || kind >= MAX_KIND) return ERR_INVALID_PARAMETER;
  enabled[kind] = 1; note("enable %d", kind); return OK;
}
CUptiResult cuptiActivityDisable(int kind) {
  if (kind <= 0 || kind >= MAX_KIND) return ERR_INVALID_PARAMETER;
  enabled[kind] = 0; note("disable %d", kind); return OK;
}
CUptiResult cuptiActivityEnableRuntimeApi(uint32_t cbid, uint8_t on) {
  if (cbid >= MAX_CBID) return ERR_INVALID_PARAMETER;
  api_off[1][cbid] = !on; note("runtime_cbid %u %u", cbid, on); return OK;
}
CUptiResult cuptiActivityEnableDriverApi(uint32_t cbid, uint8_t on) {
  if (cbid >= MAX_CBID) return ERR_INVALID_PARAMETER;
  api_off[0][cbid] = !on; note("driver_cbid %u %u", cbid, on); return OK;
}
CUptiResult cuptiActivityFlushPeriod(uint32_t ms) { note("flush_period %u", ms); return OK; }
CUptiResult cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *n) {
  (void)ctx; (void)stream;
  pthread_mutex_lock(&mu); *n = dropped; dropped = 0; pthread_mutex_unlock(&mu);
  return OK;
}
CUptiResult cuptiActivityPushExternalCorrelationId(int kind, uint64_t id) {
  (void)kind; if (ext_depth == 64) return ERR_MAX_LIMIT_REACHED;
  ext_stack[ext_depth++] = id; return OK;
}
CUptiResult cuptiActivityPopExternalCorrelationId(int kind, uint64_t *id) {
  (void)kind; if (!ext_depth) return ERR_QUEUE_EMPTY;
  uint64_t v = ext_stack[--ext_depth]; if (id) *id = v; return OK;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
  uint8_t *at;
  if (*record == NULL) {
    at = buffer;
  } else {
    uint8_t *cur = (uint8_t *)*record;
    int32_t kind; memcpy(&kind, cur, 4);
    at = cur + aligned(kind_size[kind]);
  }
  if (at >= buffer + valid) return ERR_MAX_LIMIT_REACHED;
  *record = at; return OK;
}

/* Hand every queued record to the client in as many buffers as it takes (on the calling thread). */
static void deliver(void) {
  pthread_mutex_lock(&mu);
  Rec *list = head; head = tail = NULL;
  if (n_deliveries < 64 && list) delivery_tids[n_deliveries++] = (long)syscall(SYS_gettid);
  pthread_mutex_unlock(&mu);
  while (list) {
    uint8_t *buf = NULL; size_t size = 0, max_records = 0;
    on_request(&buf, &size, &max_records);
    if (!buf || size < aligned(list->size)) { fprintf(stderr, "fake cupti: no usable buffer\n"); abort(); }
    size_t used = 0, count = 0;
    while (list && used + aligned(list->size) <= size && (!max_records || count < max_records)) {
      memset(buf + used, 0, aligned(list->size));
      memcpy(buf + used, list->bytes, list->size);
      used += aligned(list->size); count++;
      Rec *done = list; list = list->next; free(done);
    }
    note("deliver %zu records", count);
    on_complete(NULL, 0, buf, size, used);
  }
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  note("flush %u", flag);
  if (on_request && on_complete) deliver();
  return OK;
}

/* ----------------------------------------------------------- test hooks */

/* Queue one record (CUPTI's own layout, built by the test with cupti-python's dtypes) as CUPTI
   would record it now: dropped when its kind is disabled or, for API records, its cbid is
   switched off; API records get this thread's id in CUPTI's current thread-id flavour.
   Returns 1 when recorded, 0 when CUPTI would not have recorded it. */
int fake_queue(const void *bytes, size_t size) {
  if (size < 8) return -1;
  int32_t kind; memcpy(&kind, bytes, 4);
  if (kind <= 0 || kind >= MAX_KIND) return -1;
  pthread_mutex_lock(&mu);
  int recorded = 0;
  if (enabled[kind]) {
    uint32_t cbid = 0;
    if (kind == KIND_DRIVER || kind == KIND_RUNTIME) memcpy(&cbid, (const uint8_t *)bytes + 4, 4);
    if (!((kind == KIND_DRIVER || kind == KIND_RUNTIME) && cbid < MAX_CBID && api_off[kind == KIND_RUNTIME][cbid])) {
      Rec *r = malloc(sizeof(Rec) + size);
      r->next = NULL; r->size = size; memcpy(r->bytes, bytes, size);
      if (kind == KIND_DRIVER || kind == KIND_RUNTIME) {   /* CUpti_ActivityAPI: threadId at offset 28 */
        uint32_t tid = thread_id_type == 1 ? (uint32_t)syscall(SYS_gettid) : (uint32_t)(uintptr_t)pthread_self();
        memcpy(r->bytes + 28, &tid, 4);
      }
      kind_size[kind] = size;
      if (tail) tail->next = r; else head = r;
      tail = r; recorded = 1;
    }
  }
  pthread_mutex_unlock(&mu);
  return recorded;
}

/* A kernel name that lives as long as the process, as CUPTI's interned names do. */
const char *fake_intern(const char *s) { return strdup(s); }

static void *worker(void *arg) { (void)arg; deliver(); return NULL; }
/* Deliver queued records from a thread Python never saw (as CUPTI's worker does) and wait for it.
   Call through ctypes.CDLL, which releases the GIL, so the callback can take it. */
int fake_deliver_from_native_thread(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL)) return -1;
  return pthread_join(t, NULL);
}
void fake_set_dropped(size_t n) { pthread_mutex_lock(&mu); dropped = n; pthread_mutex_unlock(&mu); }
void fake_hold_subscriber(const char *other) { snprintf(other_subscriber, sizeof other_subscriber, "%s", other ? other : ""); }
const char *fake_call_log(void) { return call_log; }
int fake_delivery_count(void) { return n_deliveries; }
long fake_delivery_tid(int i) { return (i >= 0 && i < n_deliveries) ? delivery_tids[i] : -1; }
int fake_pending(void) { int n = 0; pthread_mutex_lock(&mu); for (Rec *r = head; r; r = r->next) n++; pthread_mutex_unlock(&mu); return n; }
