/*
 * A minimal ITT collector for polyprof's tests, written from the public ITT ABI
 * (ittnotify.h / ittnotify_static.c): no VTune needed.
 *
 * The ITT "static part" linked into torch and into the ittapi wheel dlopen()s
 * the library named by INTEL_LIBITTNOTIFY64 at the first ITT call. Because this
 * library exports __itt_api_version, the static part binds the functions below
 * by name for the groups listed in INTEL_ITTNOTIFY_GROUPS (run with "all").
 * __itt_domain_create must exist and return a domain with flags != 0, or the
 * static part hands out a disabled dummy domain and skips every task call.
 *
 * Every call appends one line to the file named by POLYPROF_ITT_LOG:
 *   B <tid> <domain> <name>     task begin
 *   E <tid> <domain>            task end
 *   T <tid> <name>              thread named
 * Each line is written with one write() on an O_APPEND descriptor, so lines
 * from different threads never interleave.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct ___itt_domain {
    volatile int flags;
    const char *nameA;
    void *nameW;
    int extra1;
    void *extra2;
    struct ___itt_domain *next;
} __itt_domain;

typedef struct ___itt_string_handle {
    const char *strA;
    void *strW;
    int extra1;
    void *extra2;
    struct ___itt_string_handle *next;
} __itt_string_handle;

typedef struct ___itt_id {
    unsigned long long d1, d2, d3;
} __itt_id;

/* ITT API version 3: makes the static part bind by group instead of "legacy". */
int __itt_api_version = 3;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __itt_domain *domains;
static __itt_string_handle *strings;

static void log_line(const char *fmt, const char *a, const char *b) {
    static int fd = -2;
    char line[4096];
    int n;
    if (fd == -2) {
        const char *path = getenv("POLYPROF_ITT_LOG");
        fd = path ? open(path, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    }
    if (fd < 0)
        return;
    n = snprintf(line, sizeof line, fmt, (long)syscall(SYS_gettid), a, b);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
        /* nothing useful to do in a test collector */
    }
}

__itt_domain *__itt_domain_create(const char *name) {
    __itt_domain *d;
    pthread_mutex_lock(&lock);
    for (d = domains; d; d = d->next)
        if (strcmp(d->nameA, name) == 0)
            break;
    if (!d) {
        d = calloc(1, sizeof *d);
        d->flags = 1;
        d->nameA = strdup(name);
        d->next = domains;
        domains = d;
    }
    pthread_mutex_unlock(&lock);
    return d;
}

__itt_string_handle *__itt_string_handle_create(const char *name) {
    __itt_string_handle *s;
    pthread_mutex_lock(&lock);
    for (s = strings; s; s = s->next)
        if (strcmp(s->strA, name) == 0)
            break;
    if (!s) {
        s = calloc(1, sizeof *s);
        s->strA = strdup(name);
        s->next = strings;
        strings = s;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

void __itt_task_begin(const __itt_domain *domain, __itt_id taskid, __itt_id parentid,
                      __itt_string_handle *name) {
    (void)taskid;
    (void)parentid;
    log_line("B %ld %s %s\n", domain->nameA, name ? name->strA : "");
}

void __itt_task_end(const __itt_domain *domain) { log_line("E %ld %s%s\n", domain->nameA, ""); }

void __itt_thread_set_name(const char *name) { log_line("T %ld %s%s\n", name, ""); }
