/* A store of endpoints in POSIX shared memory (shared.h): every process on
 * the host that opens "shm:NAME" maps the same file, /dev/shm/llmretry-NAME
 * on Linux. Created on first use, mode 0600, with a versioned header; a
 * file that is not ours (another owner, other permissions, another layout
 * or version) is refused with a message naming it, never reused. Nothing
 * in it is a secret: endpoints are known by a hash of URL and key. */
#include "shared.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "llmrshm"                  /* 8 bytes with its NUL */
#define VERSION 1u
#define SLOTS 256u                       /* endpoints per store, as per engine */

typedef struct shm_header {
    char magic[8];
    uint32_t version;
    uint32_t slots;
    uint64_t slot_size;
    uint64_t file_size;
    char pad[32];                        /* slots start 64-byte aligned */
} shm_header;

struct lr_shm {
    int fd;
    void *map;
    size_t size;
    shm_header *head;
    lr_shared_ep *eps;
    char path[128];
};

static size_t file_size(void)
{
    return sizeof(shm_header) + (size_t)SLOTS * sizeof(lr_shared_ep);
}

/* NAME: what may follow "llmretry-" in a file name, and nothing that could
 * walk out of /dev/shm. */
static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 64 || name[0] == '.')
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '.'))
            return 0;
    return 1;
}

static int fail(lr_shm *s, char *err, size_t len, const char *fmt, const char *what)
{
    if (err && len)
        snprintf(err, len, fmt, what);
    if (s) {
        if (s->map && s->map != MAP_FAILED)
            munmap(s->map, s->size);
        if (s->fd >= 0)
            close(s->fd);
        free(s);
    }
    return -1;
}

/* A new file (size 0, under the lock): its size and header. Zeros are a
 * store with no endpoint, so only the header needs writing. */
static int create_layout(lr_shm *s)
{
    if (ftruncate(s->fd, (off_t)s->size) != 0)
        return -1;
    s->map = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->map == MAP_FAILED)
        return -1;
    shm_header *h = s->map;
    h->version = VERSION;
    h->slots = SLOTS;
    h->slot_size = sizeof(lr_shared_ep);
    h->file_size = s->size;
    memcpy(h->magic, MAGIC, sizeof h->magic);
    return 0;
}

int lr_shm_open(const char *spec, lr_shm **out, char *err, size_t len)
{
    *out = NULL;
    const char *name = spec + 4;
    if (!valid_name(name))
        return fail(NULL, err, len, "shared: \"shm:%.64s\": NAME must be 1 to 64 of "
                    "[A-Za-z0-9_.-], not starting with a dot", name);
    lr_shm *s = calloc(1, sizeof *s);
    if (!s)
        return fail(NULL, err, len, "shared: out of memory%s", "");
    s->fd = -1;
    s->size = file_size();
    char obj[80];
    snprintf(obj, sizeof obj, "/llmretry-%s", name);
    snprintf(s->path, sizeof s->path, "/dev/shm%s", obj);
    /* shm_open opens with O_NOFOLLOW and O_CLOEXEC; 0600 (less the umask)
     * when it creates. */
    s->fd = shm_open(obj, O_RDWR | O_CREAT, 0600);
    if (s->fd < 0)
        return fail(s, err, len, "shared: cannot open %s", s->path);
    /* Whoever creates it lays it out; the others wait for that here. */
    if (flock(s->fd, LOCK_EX) != 0)
        return fail(s, err, len, "shared: cannot lock %s", s->path);
    struct stat st;
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0)
        return fail(s, err, len, "shared: %s is not this user's private file (owner and "
                    "mode 0600 expected): remove it or pick another NAME", s->path);
    if (st.st_size == 0) {
        if (create_layout(s) != 0)
            return fail(s, err, len, "shared: cannot set up %s", s->path);
    } else {
        if ((size_t)st.st_size != s->size)
            return fail(s, err, len, "shared: %s has another layout (another llmretry version, "
                        "or not llmretry's): remove it or pick another NAME", s->path);
        s->map = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (s->map == MAP_FAILED)
            return fail(s, err, len, "shared: cannot map %s", s->path);
        const shm_header *h = s->map;
        if (memcmp(h->magic, MAGIC, sizeof h->magic) != 0 || h->version != VERSION ||
            h->slots != SLOTS || h->slot_size != sizeof(lr_shared_ep) || h->file_size != s->size)
            return fail(s, err, len, "shared: %s has another layout (another llmretry version, "
                        "or not llmretry's): remove it or pick another NAME", s->path);
    }
    flock(s->fd, LOCK_UN);
    s->head = s->map;
    s->eps = (lr_shared_ep *)((char *)s->map + sizeof(shm_header));
    *out = s;
    return 0;
}

void lr_shm_close(lr_shm *s)
{
    if (!s)
        return;
    munmap(s->map, s->size);
    close(s->fd);
    free(s);
}

lr_shared_ep *lr_shm_endpoint(lr_shm *s, uint64_t id)
{
    /* Open addressing: a slot is claimed once, by a compare-and-swap of its
     * id from 0, and never given back (a store lives as long as its file). */
    for (uint32_t i = 0; i < SLOTS; i++) {
        lr_shared_ep *ep = &s->eps[(id + i) % SLOTS];
        uint64_t have = atomic_load(&ep->id);
        if (have == id)
            return ep;
        if (have == 0) {
            if (atomic_compare_exchange_strong(&ep->id, &have, id) || have == id)
                return ep;
        }
    }
    return NULL;
}

const char *lr_shm_path(const lr_shm *s)
{
    return s->path;
}
