/* How much preparing page-cache pages costs on this machine right now:
 * a 512 MiB sparse file in the current directory, mapped shared and made
 * resident 2 MiB at a time, timed. Mode 0: MADV_POPULATE_READ (what the
 * store does ahead of its writer in async mode), 1: MADV_POPULATE_WRITE,
 * 2: one byte written per page, 3: fallocate first, then populate-read.
 *   gcc -O2 bench/coldstart/populate_probe.c -o /tmp/populate_probe
 *   for m in 0 1 2 3; do /tmp/populate_probe $m; done
 * Run it several times: on a guest that hands freed pages back to the host
 * the cost moves with how fresh the memory it gets is. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
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
    if (mode == 3 && fallocate(fd, 0, 0, n) != 0) { perror("fallocate"); return 1; }
    char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    double t = now();
    for (size_t o = 0; o < n; o += step) {
        if (mode == 0 || mode == 3) madvise(p + o, step, MADV_POPULATE_READ);
        else if (mode == 1) madvise(p + o, step, MADV_POPULATE_WRITE);
        else for (size_t i = 0; i < step; i += 4096) p[o + i] = 1;
    }
    printf("mode %d: %.3f s per GiB\n", mode, (now() - t) * (1 << 30) / n);
    munmap(p, n);
    close(fd);
    unlink(path);
    return 0;
}
