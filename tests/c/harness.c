/* The C test harness (see harness.h): counters, a summary line, and a
 * launcher plus HTTP helpers for the mock server. The helpers use libcurl
 * easy handles directly: they are test utilities, not the system under
 * test, so they must not depend on the engine. */
#include <stdatomic.h>
#include "harness.h"
#include "llmretry.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LLMRETRY_SOURCE_DIR
#define LLMRETRY_SOURCE_DIR "."
#endif

#define TH_START_TIMEOUT_MS 10000
#define TH_STOP_GRACE_MS 3000
#define TH_HTTP_TIMEOUT_MS 5000

extern char **environ;

int th_passed = 0;
int th_failed = 0;

void th_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    th_failed++;
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

int th_summary(const char *suite)
{
    printf("%s: %d passed, %d failed\n", suite, th_passed, th_failed);
    fflush(stdout);
    /* A suite that checked nothing has not shown anything works. */
    return (th_failed == 0 && th_passed > 0) ? 0 : 1;
}

int64_t th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void th_sleep_ms(int64_t ms)
{
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

char *th_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (cap - n < 4096) {
            size_t ncap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* ------------------------------------------------------------------ */
/* Mock server process.                                               */
/* ------------------------------------------------------------------ */

/* The child's stdout and stderr share one pipe. After the port line we
 * keep draining it on a thread, so a chatty server never blocks on a full
 * pipe nor dies of EPIPE; its output is shown only with TH_MOCK_VERBOSE. */
static void *drain_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    int verbose = getenv("TH_MOCK_VERBOSE") != NULL;
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (verbose && fwrite(buf, 1, (size_t)n, stderr) != (size_t)n)
            break;
    }
    close(fd);
    return NULL;
}

/* A copy of environ with PYTHONPATH pointing at our python/ first, built
 * before fork() because the child of a threaded process may only call
 * async-signal-safe functions until exec. */
static char **child_environ(void)
{
    static const char src_py[] = LLMRETRY_SOURCE_DIR "/python";
    const char *old = getenv("PYTHONPATH");
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "PYTHONPATH=", 11) == 0 ||
            strncmp(environ[i], "PYTHONUNBUFFERED=", 17) == 0)
            continue;
        env[k++] = environ[i];
    }
    size_t plen = sizeof src_py + 16 + (old ? strlen(old) + 1 : 0);
    char *pp = malloc(plen);
    if (!pp) {
        free(env);
        return NULL;
    }
    if (old && *old)
        snprintf(pp, plen, "PYTHONPATH=%s:%s", src_py, old);
    else
        snprintf(pp, plen, "PYTHONPATH=%s", src_py);
    env[k++] = pp;
    /* The port line must not sit in a stdio buffer. */
    env[k++] = "PYTHONUNBUFFERED=1";
    env[k] = NULL;
    return env;
}

static void free_child_environ(char **env)
{
    for (size_t i = 0; env[i]; i++)
        if (strncmp(env[i], "PYTHONPATH=", 11) == 0)
            free(env[i]);
    free(env);
}

/* Read lines until one is a bare port number. Anything else (warnings,
 * a traceback) is kept in `junk` to explain a failed start. */
static int read_port(int fd, char *junk, size_t junklen)
{
    char line[512];
    size_t ll = 0, jl = 0;
    int64_t end = th_now_ms() + TH_START_TIMEOUT_MS;
    junk[0] = '\0';
    for (;;) {
        int64_t left = end - th_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        char c;
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -2; /* the server exited (or closed stdout) first */
        if (c != '\n') {
            if (ll < sizeof line - 1)
                line[ll++] = c;
            continue;
        }
        line[ll] = '\0';
        char *endp = NULL;
        long port = strtol(line, &endp, 10);
        while (endp && (*endp == ' ' || *endp == '\r'))
            endp++;
        if (ll > 0 && endp && *endp == '\0' && port > 0 && port < 65536)
            return (int)port;
        if (jl < junklen - 1) {
            int w = snprintf(junk + jl, junklen - jl, "%s\n", line);
            if (w > 0)
                jl += (size_t)w < junklen - jl ? (size_t)w : junklen - jl - 1;
        }
        ll = 0;
    }
}

static void reap(pid_t pid)
{
    int64_t end = th_now_ms() + TH_STOP_GRACE_MS;
    kill(pid, SIGTERM);
    for (;;) {
        pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return;
        if (th_now_ms() >= end)
            break;
        struct timespec ts = { 0, 20 * 1000000L };
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

static int start_mock(th_mock *m)
{
    static const char *const argv[] = { "python3", "-m", "llmretry.testing",
                                        "--port", "0", NULL };
    int fds[2];
    memset(m, 0, sizeof *m);
    m->pid = -1;
    /* Writing to a connection the server reset must fail with EPIPE, not
     * kill the test. */
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    char **env = child_environ();
    if (!env)
        return -1;
    if (pipe2(fds, O_CLOEXEC) != 0) {
        free_child_environ(env);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        free_child_environ(env);
        return -1;
    }
    if (pid == 0) {
        /* A crashed test must not leave its server running. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, STDIN_FILENO);
        execvpe(argv[0], (char *const *)argv, env);
        _exit(127);
    }
    free_child_environ(env);
    close(fds[1]);

    char junk[2048];
    int port = read_port(fds[0], junk, sizeof junk);
    if (port < 0) {
        if (port == -2)
            fprintf(stderr, "harness: mock server exited before reporting its port\n%s", junk);
        else
            fprintf(stderr, "harness: mock server did not report a port within %d ms\n%s",
                    TH_START_TIMEOUT_MS, junk);
        close(fds[0]);
        reap(pid);
        return -1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, drain_thread, (void *)(intptr_t)fds[0]) == 0)
        pthread_detach(t);
    else
        close(fds[0]);

    m->pid = pid;
    m->port = port;
    snprintf(m->base_url, sizeof m->base_url, "http://127.0.0.1:%d/v1", port);
    return 0;
}

void th_mock_stop(th_mock *m)
{
    if (m->pid > 0)
        reap(m->pid);
    m->pid = -1;
}

/* ---- redis-server ------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Up when it answers PING (with the password, when it wants one). */
static int redis_answers(const th_redis *r)
{
    struct timeval tv = { 0, 200000 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    int ok = 0;
    if (c && !c->err) {
        redisReply *rep = r->password[0] ? redisCommand(c, "AUTH %s", r->password) : NULL;
        int authed = !r->password[0] || (rep && rep->type == REDIS_REPLY_STATUS);
        freeReplyObject(rep);
        rep = authed ? redisCommand(c, "PING") : NULL;
        ok = rep && rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
    }
    if (c)
        redisFree(c);
    return ok;
}

static int redis_spawn(th_redis *r)
{
    char port[16], log[96];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    const char *argv[24];
    int n = 0;
    argv[n++] = "redis-server";
    argv[n++] = "--port"; argv[n++] = port;
    argv[n++] = "--bind"; argv[n++] = "127.0.0.1";
    argv[n++] = "--save"; argv[n++] = "";
    argv[n++] = "--appendonly"; argv[n++] = "no";
    argv[n++] = "--dir"; argv[n++] = r->dir;
    argv[n++] = "--logfile"; argv[n++] = log;
    argv[n++] = "--daemonize"; argv[n++] = "no";
    if (r->password[0]) {
        argv[n++] = "--requirepass";
        argv[n++] = r->password;
    }
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, STDIN_FILENO);
            dup2(devnull, STDOUT_FILENO);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    r->pid = pid;
    for (int64_t end = th_now_ms() + TH_START_TIMEOUT_MS; th_now_ms() < end;) {
        if (redis_answers(r))
            return 0;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {  /* exited: port taken, or no binary */
            r->pid = -1;
            return WIFEXITED(status) && WEXITSTATUS(status) == 127 ? -2 : -1;
        }
        struct timespec ts = { 0, 10 * 1000000L };
        nanosleep(&ts, NULL);
    }
    th_redis_kill(r);
    return -1;
}

int th_redis_start(th_redis *r, const char *password)
{
    memset(r, 0, sizeof *r);
    r->pid = -1;
    snprintf(r->password, sizeof r->password, "%s", password ? password : "");
    snprintf(r->dir, sizeof r->dir, "/tmp/th-redis-XXXXXX");
    if (!mkdtemp(r->dir)) {
        th_fail(__FILE__, __LINE__, "setup: mkdtemp failed");
        return -1;
    }
    int rc = -1;
    for (int tries = 0; tries < 5 && rc == -1; tries++) {   /* a port taken meanwhile */
        r->port = free_port();
        rc = r->port > 0 ? redis_spawn(r) : -1;
    }
    if (rc != 0) {
        th_fail(__FILE__, __LINE__, rc == -2
                ? "setup: redis-server is not installed (tools/ensure-deps.sh installs it)"
                : "setup: redis-server did not start");
        return -1;
    }
    snprintf(r->url, sizeof r->url, "redis://%s%s%s127.0.0.1:%d/0", r->password[0] ? ":" : "",
             r->password, r->password[0] ? "@" : "", r->port);
    return 0;
}

void th_redis_kill(th_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    r->pid = -1;
}

int th_redis_restart(th_redis *r)
{
    th_redis_kill(r);
    int rc = redis_spawn(r);
    if (rc != 0)
        th_fail(__FILE__, __LINE__, "setup: redis-server did not start again on port %d", r->port);
    return rc;
}

void th_redis_stop(th_redis *r)
{
    th_redis_kill(r);
    if (r->dir[0]) {
        char path[128];
        snprintf(path, sizeof path, "%s/redis.log", r->dir);
        unlink(path);
        rmdir(r->dir);
    }
}

const char *th_mock_scenario_url(const th_mock *m, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "http://127.0.0.1:%d/s/%s/v1", m->port, name);
    return buf;
}

/* ------------------------------------------------------------------ */
/* Control API over HTTP.                                             */
/* ------------------------------------------------------------------ */

typedef struct membuf {
    char *p;
    size_t n, cap;
} membuf;

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    membuf *b = ud;
    size_t add = size * nmemb;
    if (b->n + add + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 4096;
        while (ncap < b->n + add + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np)
            return 0;
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->n, data, add);
    b->n += add;
    b->p[b->n] = '\0';
    return add;
}

/* One control request. Returns the HTTP status (0 on transport failure);
 * the body goes to *out (malloc'd) when out is non-NULL. */
static long control(const th_mock *m, const char *method, const char *path,
                    const char *body, char **out)
{
    char url[512];
    membuf b = { 0 };
    long status = 0;
    struct curl_slist *hdrs = NULL;
    CURL *h = curl_easy_init();
    if (!h)
        return 0;
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", m->port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    /* The mock is local: an http_proxy in the environment must not
     * intercept these requests. */
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)TH_HTTP_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    if (body) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        fprintf(stderr, "harness: %s %s: %s\n", method, path, curl_easy_strerror(rc));
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (out && status > 0) {
        if (!b.p)
            b.p = calloc(1, 1);
        *out = b.p;
    } else {
        free(b.p);
    }
    return status;
}

int th_mock_start(th_mock *m)
{
    int rc = start_mock(m);
    if (rc != 0)                        /* no server, no test: a failure */
        th_fail(__FILE__, __LINE__, "setup: the mock server did not start");
    return rc;
}

int th_mock_script(th_mock *m, const char *name, const char *scenario_json)
{
    char path[256];
    snprintf(path, sizeof path, "/_mock/scenarios/%s", name);
    long st = control(m, "PUT", path, scenario_json, NULL);
    if (st < 200 || st >= 300) {
        /* A test whose mock refused its script tests nothing: count it as a
         * failure here, so no caller can skip its checks and still pass. */
        th_fail(__FILE__, __LINE__, "setup: scripting scenario %s failed (HTTP %ld)", name, st);
        return -1;
    }
    return 0;
}

int th_mock_put(th_mock *m, const char *path, const char *json)
{
    long st = control(m, "PUT", path, json, NULL);
    if (st < 200 || st >= 300) {
        th_fail(__FILE__, __LINE__, "setup: PUT %s failed (HTTP %ld)", path, st);
        return -1;
    }
    return 0;
}

int th_mock_advance_clock(th_mock *m, const char *name, int64_t ms)
{
    char path[256], body[64];
    snprintf(path, sizeof path, "/_mock/clock/%s", name);
    snprintf(body, sizeof body, "{\"advance_ms\": %lld}", (long long)ms);
    long st = control(m, "POST", path, body, NULL);
    if (st < 200 || st >= 300) {
        th_fail(__FILE__, __LINE__, "setup: advancing %s's clock failed (HTTP %ld)", name, st);
        return -1;
    }
    return 0;
}

char *th_mock_requests(th_mock *m, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "/_mock/requests/%s", name);
    return th_mock_get(m, path);
}

char *th_mock_get(th_mock *m, const char *path)
{
    char *out = NULL;
    long st = control(m, "GET", path, NULL, &out);
    if (st != 200) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---- engine-level plumbing ---------------------------------------------- */

/* Every test executable is linked with -Wl,--wrap=llmretry_engine_new
 * (CMakeLists.txt): under LLMRETRY_TEST_IO_LOOP=events (ctest's *_events
 * entries) an engine asked for with the default loop gets the events loop,
 * so the whole engine-level suite runs on both. */
llmretry_status __real_llmretry_engine_new(const llmretry_engine_options *opts,
                                           llmretry_engine **out, char *err, size_t errlen);
llmretry_status __wrap_llmretry_engine_new(const llmretry_engine_options *opts,
                                           llmretry_engine **out, char *err, size_t errlen);

int th_io_loop(void)
{
    const char *v = getenv("LLMRETRY_TEST_IO_LOOP");
    return v && strcmp(v, "events") == 0 ? LLMRETRY_IO_LOOP_EVENTS : LLMRETRY_IO_LOOP_PERFORM;
}

llmretry_status __wrap_llmretry_engine_new(const llmretry_engine_options *opts,
                                           llmretry_engine **out, char *err, size_t errlen)
{
    llmretry_engine_options o;
    if (opts)
        o = *opts;
    else
        llmretry_engine_options_defaults(&o);
    if (o.io_loop == LLMRETRY_IO_LOOP_PERFORM)
        o.io_loop = th_io_loop();
    return __real_llmretry_engine_new(&o, out, err, errlen);
}

#ifdef __linux__
#include <sys/epoll.h>
/* The core's epoll_ctl calls (-Wl,--wrap=epoll_ctl: only the statically
 * linked core's, not libcurl's). */
atomic_long th_epoll_ctls;
int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *event);
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *event);
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
    atomic_fetch_add(&th_epoll_ctls, 1);
    return __real_epoll_ctl(epfd, op, fd, event);
}
#endif

/* Share handles the core made and freed (-Wl,--wrap=curl_share_init,
 * curl_share_cleanup): the engine's connection-cache shards (conn_shards.c). */
atomic_long th_share_inits;
CURLSH *__real_curl_share_init(void);
CURLSH *__wrap_curl_share_init(void);
CURLSH *__wrap_curl_share_init(void)
{
    atomic_fetch_add(&th_share_inits, 1);
    return __real_curl_share_init();
}

atomic_long th_share_cleanups;
CURLSHcode __real_curl_share_cleanup(CURLSH *share);
CURLSHcode __wrap_curl_share_cleanup(CURLSH *share);
CURLSHcode __wrap_curl_share_cleanup(CURLSH *share)
{
    CURLSHcode rc = __real_curl_share_cleanup(share);
    if (rc == CURLSHE_OK)
        atomic_fetch_add(&th_share_cleanups, 1);
    return rc;
}

int th_engine_new_as_asked(const llmretry_engine_options *opts,
                           llmretry_engine **out, char *err, size_t errlen)
{
    return __real_llmretry_engine_new(opts, out, err, errlen);
}

llmretry_engine *th_engine_new(void)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF];
    CHECK_MSG(llmretry_engine_new(&eo, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    return e;
}

llmretry_engine *th_host_engine_new(int max_in_flight)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.io_loop = LLMRETRY_IO_LOOP_HOST;
    if (max_in_flight > 0)
        eo.max_in_flight = max_in_flight;
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_MSG(llmretry_engine_new(&eo, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    return e;
}

llmretry_call *th_submit(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF];
    CHECK_MSG(llmretry_engine_submit(e, o, 0, &c, err, sizeof err) == LLMRETRY_OK, "submit: %s", err);
    return c;
}

const llmretry_result *th_wait_done(llmretry_call *c, int64_t max_ms)
{
    int64_t until = th_now_ms() + max_ms;
    while (c && th_now_ms() < until) {
        llmretry_event *ev;
        llmretry_mail m = llmretry_call_next(c, &ev);
        if (m == LLMRETRY_MAIL_DONE)
            return llmretry_call_result(c);
        if (m == LLMRETRY_MAIL_EVENT)
            llmretry_event_free(ev);
        else
            llmretry_call_wait(c, 50);
    }
    return NULL;
}

void th_run_cases(const th_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int before = th_failed;
        int64_t t0 = th_now_ms();
        cases[i].fn();
        fprintf(stderr, "%-28s %s (%lld ms)\n", cases[i].name,
                th_failed == before ? "ok" : "FAILED", (long long)(th_now_ms() - t0));
    }
}
