/* How much preparing page-cache pages costs on this machine right now:
 * a 512 MiB sparse file in the current directory, mapped shared and made
 * resident 2 MiB at a time, timed. Mode 0: MADV_POPULATE_READ (what the
 * store does ahead of its writer in async mode), 1: MADV_POPULATE_WRITE,
 * 2: one byte written per page, 3: fallocate first, then populate-read,
 * 4: populate-read under MADV_RANDOM (no read-ahead: base 4 KiB page-cache
 * folios instead of read-ahead's large ones; FileHugePages in /proc/meminfo
 * shows which). Modes 5 and 6 time msync instead: 64 stored 1 KiB messages
 * (64 x 1141 B) written and msynced per round into a fallocated, already
 * written file, 3 s, in large folios (5) or base pages (6). Mode 7 touches
 * 512 MiB of anonymous memory in 4 KiB pages (MADV_NOHUGEPAGE), for
 * comparison with what a heap-only broker pays. Modes 8 and 9 store
 * 512 MiB of data: pwrite(2) in argv[2]-KiB chunks (8) against populate
 * then copy into the mapping (9).
 *   gcc -O2 bench/coldstart/populate_probe.c -o /tmp/populate_probe
 *   for m in 0 1 2 3 4 5 6; do sleep 8; /tmp/populate_probe $m; done
 * Run it several times: on a guest that hands freed pages back to the host
 * the cost moves with how fresh the memory it gets is. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const size_t n = 512UL << 20, step = 2UL << 20;
    const char *path = "populate_probe.tmp";
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    unlink(path);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, n) != 0) { perror(path); return 1; }
    if (mode == 7) {
        char *a = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED || madvise(a, n, MADV_NOHUGEPAGE) != 0) { perror("anonymous"); return 1; }
        double t = now();
        for (size_t i = 0; i < n; i += 4096) a[i] = 1;
        printf("mode 7: %.3f s per GiB\n", (now() - t) * (1 << 30) / n);
        close(fd);
        unlink(path);
        return 0;
    }
    if (mode == 8 || mode == 9) {
        /* The same 512 MiB of data stored two ways, each into a fresh
         * sparse file: 8 = pwrite(2) in chunks of argv[2] KiB (default 64)
         * from one warm buffer (the kernel allocates the page-cache folios
         * and copies; a whole-page write needs no zeroing), 9 = what the
         * store's async writer does, the window populated (2 MiB steps)
         * then the data copied into the mapping. */
        size_t chunk = (argc > 2 ? (size_t)atol(argv[2]) : 64) << 10;
        char *buf = malloc(chunk);
        if (!buf) return 1;
        memset(buf, 0x5a, chunk);
        char *p = mode == 9 ? mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : 0;
        if (p == MAP_FAILED) { perror("mmap"); return 1; }
        double t = now();
        for (size_t o = 0; o < n; o += chunk) {
            if (mode == 8) {
                if (pwrite(fd, buf, chunk, (off_t)o) != (ssize_t)chunk) { perror("pwrite"); return 1; }
            } else {
                if (o % step == 0 && madvise(p + o, step, MADV_POPULATE_READ) != 0) { perror("madvise"); return 1; }
                memcpy(p + o, buf, chunk);
            }
        }
        double stored = now() - t;
        /* Then written back, as the store's flush would (msync of the
         * mapping in mode 9, fdatasync in 8: the same range write-back). */
        t = now();
        if ((mode == 9 ? msync(p, n, MS_SYNC) : fdatasync(fd)) != 0) { perror("sync"); return 1; }
        printf("mode %d: %.3f s per GiB stored, %.3f s per GiB written back (%zu KiB chunks)\n", mode,
               stored * (1 << 30) / n, (now() - t) * (1 << 30) / n, chunk >> 10);
        close(fd);
        unlink(path);
        return 0;
    }
    if ((mode == 3 || mode >= 5) && fallocate(fd, 0, 0, n) != 0) { perror("fallocate"); return 1; }
    char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    if (mode >= 5) {
        const size_t chunk = 64 * 1141;
        if ((mode == 6 && madvise(p, n, MADV_RANDOM) != 0) || madvise(p, n, MADV_POPULATE_WRITE) != 0 ||
            madvise(p, n, MADV_NORMAL) != 0) { perror("madvise"); return 1; }
        msync(p, n, MS_SYNC);
        size_t pos = 0;
        long syncs = 0;
        double t = now();
        while (now() - t < 3.0) {
            if (pos + chunk > n) pos = 0;
            memset(p + pos, 0x5a, chunk);
            size_t from = pos & ~4095UL;
            msync(p + from, pos + chunk - from, MS_SYNC);
            pos += chunk;
            syncs++;
        }
        printf("mode %d: %.0f us per 64-message msync\n", mode, (now() - t) * 1e6 / syncs);
        munmap(p, n);
        close(fd);
        unlink(path);
        return 0;
    }
    double t = now();
    for (size_t o = 0; o < n; o += step) {
        int rc = 0;
        if (mode == 0 || mode == 3) rc = madvise(p + o, step, MADV_POPULATE_READ);
        else if (mode == 4)
            rc = madvise(p + o, step, MADV_RANDOM) || madvise(p + o, step, MADV_POPULATE_READ) ||
                 madvise(p + o, step, MADV_NORMAL);
        else if (mode == 1) rc = madvise(p + o, step, MADV_POPULATE_WRITE);
        else for (size_t i = 0; i < step; i += 4096) p[o + i] = 1;
        if (rc != 0) { perror("madvise"); return 1; }
    }
    printf("mode %d: %.3f s per GiB\n", mode, (now() - t) * (1 << 30) / n);
    munmap(p, n);
    close(fd);
    unlink(path);
    return 0;
}
