/* linkemu: a user-space wire emulator between pairs of TAP devices (bench/wan/).
 *
 * This kernel has no netem, so one-way delay, jitter and loss on the emulated hosts' links are
 * added here. Each link is two TAP devices in one network namespace: the host side ("a",
 * bridged with the veth towards the host) and the upstream side ("b", a port of the hub's or
 * router's bridge). Every Ethernet frame read from one tap is held for its direction's delay
 * plus a jitter drawn per frame (uniform in [-jitter, +jitter], never earlier than the frame
 * before it: a link keeps order), dropped with the direction's loss probability, then written
 * into the other tap. Frames that are not IP (ARP) pass at once and are never dropped: on a
 * real path they never cross the long link. Bandwidth stays with tc tbf on the veths.
 *
 *   linkemu [--seed N] [--slots N] [--realtime] NETNS:TAP_A:TAP_B ...
 *
 * --realtime asks for SCHED_FIFO priority 1 (kept when refused): the wire's timing should not
 * depend on how busy the machine's other processes keep the CPU; the process sleeps in epoll
 * whenever no frame is due, and the kernel caps real-time tasks below a whole CPU.
 * NETNS names a namespace under /run/netns ("-": the current one). Prints "ready" once every
 * tap is open. Commands on stdin, one per line (answered "ok" or "error ..."):
 *   set LINK DIR DELAY_US JITTER_US LOSS_PPM    DIR 0: a->b (upload), 1: b->a (download)
 *   stats                                        one line: per link and direction
 *                                                in,out,lost,overflow,bytes,late_sum_us,
 *                                                late_max_us,late_over_1ms (frames written
 *                                                after their release time: by how much)
 *   quit                                         (also on end of input, SIGTERM or SIGINT)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BYTES 2048  /* a frame of a 1500-byte MTU plus its Ethernet header fits */
#define MAX_LINKS 512
#define READ_BATCH 64

typedef struct {
    uint64_t release_ns;
    uint32_t len;
    uint8_t data[SLOT_BYTES - 12];
} slot_t;

typedef struct {
    int in_fd, out_fd;
    int64_t delay_ns, jitter_ns;
    uint32_t loss_ppm;
    slot_t *ring;
    uint32_t head, count;
    uint64_t last_release_ns;
    uint64_t n_in, n_out, n_lost, n_overflow, n_bytes;
    uint64_t late_sum_ns, late_max_ns, n_late_ms;  /* written after their release time */
} dir_t;

static dir_t dirs[2 * MAX_LINKS];
static int n_dirs;
static uint32_t slots = 8192;
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static volatile sig_atomic_t stop;

static uint64_t rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "linkemu: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int open_tap(const char *netns, const char *name) {
    if (strcmp(netns, "-") != 0) {
        char path[512];
        snprintf(path, sizeof path, "/run/netns/%s", netns);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0) die(path);
        if (setns(ns, CLONE_NEWNET) < 0) die("setns");
        close(ns);
    }
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) die("/dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (strlen(name) >= IFNAMSIZ) { errno = ENAMETOOLONG; die(name); }
    strcpy(ifr.ifr_name, name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) die(name);
    return fd;
}

static int is_ip(const uint8_t *frame, uint32_t len) {
    if (len < 14) return 0;
    uint16_t type = (uint16_t)(frame[12] << 8 | frame[13]);
    return type == 0x0800 || type == 0x86dd;
}

/* Read what one tap has ready into its direction's queue. */
static void take(dir_t *d, uint64_t now) {
    for (int i = 0; i < READ_BATCH; i++) {
        slot_t *s = d->count < slots ? &d->ring[(d->head + d->count) % slots] : NULL;
        uint8_t spill[SLOT_BYTES];
        uint8_t *buf = s ? s->data : spill;
        ssize_t n = read(d->in_fd, buf, sizeof s->data);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) die("read");
            return;
        }
        d->n_in++;
        if (!is_ip(buf, (uint32_t)n)) {  /* ARP and the like: straight through */
            if (write(d->out_fd, buf, (size_t)n) == n) d->n_out++;
            continue;
        }
        if (!s) { d->n_overflow++; continue; }
        if (d->loss_ppm && rng() % 1000000 < d->loss_ppm) { d->n_lost++; continue; }
        int64_t delay = d->delay_ns;
        if (d->jitter_ns > 0) delay += (int64_t)(rng() % (uint64_t)(2 * d->jitter_ns + 1)) - d->jitter_ns;
        uint64_t release = now + (uint64_t)(delay > 0 ? delay : 0);
        if (release < d->last_release_ns) release = d->last_release_ns;  /* keep order */
        d->last_release_ns = release;
        s->release_ns = release;
        s->len = (uint32_t)n;
        d->count++;
    }
}

/* Write every due frame; return the earliest release still waiting (0: none). */
static uint64_t release_due(uint64_t now) {
    uint64_t next = 0;
    for (int k = 0; k < n_dirs; k++) {
        dir_t *d = &dirs[k];
        while (d->count) {
            slot_t *s = &d->ring[d->head];
            if (s->release_ns > now) {
                if (!next || s->release_ns < next) next = s->release_ns;
                break;
            }
            if (write(d->out_fd, s->data, s->len) == (ssize_t)s->len) {
                uint64_t late = now - s->release_ns;
                d->n_out++;
                d->n_bytes += s->len;
                d->late_sum_ns += late;
                if (late > d->late_max_ns) d->late_max_ns = late;
                if (late > 1000000) d->n_late_ms++;
            } else {
                d->n_overflow++;
            }
            d->head = (d->head + 1) % slots;
            d->count--;
        }
    }
    return next;
}

static void command(char *line) {
    int link, dir;
    long long delay_us, jitter_us, loss_ppm;
    if (sscanf(line, "set %d %d %lld %lld %lld", &link, &dir, &delay_us, &jitter_us, &loss_ppm) == 5) {
        if (link < 0 || 2 * link + 1 >= n_dirs || dir < 0 || dir > 1 || delay_us < 0 || jitter_us < 0 ||
            loss_ppm < 0 || loss_ppm > 1000000) {
            printf("error bad set: %s\n", line);
        } else {
            dir_t *d = &dirs[2 * link + dir];
            d->delay_ns = delay_us * 1000;
            d->jitter_ns = jitter_us * 1000;
            d->loss_ppm = (uint32_t)loss_ppm;
            printf("ok\n");
        }
    } else if (strncmp(line, "stats", 5) == 0) {
        for (int k = 0; k < n_dirs; k++) {
            dir_t *d = &dirs[k];
            printf("%s%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu", k ? " " : "", (unsigned long long)d->n_in,
                   (unsigned long long)d->n_out, (unsigned long long)d->n_lost,
                   (unsigned long long)d->n_overflow, (unsigned long long)d->n_bytes,
                   (unsigned long long)(d->late_sum_ns / 1000), (unsigned long long)(d->late_max_ns / 1000),
                   (unsigned long long)d->n_late_ms);
        }
        printf("\n");
    } else if (strncmp(line, "quit", 4) == 0) {
        stop = 1;
    } else if (line[0]) {
        printf("error unknown command: %s\n", line);
    }
    fflush(stdout);
}

static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    int argi = 1;
    while (argi < argc && !strncmp(argv[argi], "--", 2)) {
        if (!strcmp(argv[argi], "--realtime")) {
            struct sched_param sp = {.sched_priority = 1};
            if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
                fprintf(stderr, "linkemu: no real-time priority: %s\n", strerror(errno));
            argi++;
            continue;
        }
        if (argi + 1 >= argc) { fprintf(stderr, "linkemu: %s needs a value\n", argv[argi]); return 2; }
        if (!strcmp(argv[argi], "--seed")) rng_state ^= strtoull(argv[argi + 1], NULL, 10) * 0x2545F4914F6CDD1DULL;
        else if (!strcmp(argv[argi], "--slots")) slots = (uint32_t)strtoul(argv[argi + 1], NULL, 10);
        else { fprintf(stderr, "linkemu: unknown option %s\n", argv[argi]); return 2; }
        argi += 2;
    }
    if (!rng_state) rng_state = 1;
    if (argi >= argc || slots == 0) {
        fprintf(stderr, "usage: linkemu [--seed N] [--slots N] NETNS:TAP_A:TAP_B ...\n");
        return 2;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || tfd < 0) die("epoll/timerfd");
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    for (; argi < argc; argi++) {
        if (n_dirs + 2 > 2 * MAX_LINKS) { fprintf(stderr, "linkemu: too many links\n"); return 2; }
        char *spec = strdup(argv[argi]);
        char *netns = strtok(spec, ":"), *a = strtok(NULL, ":"), *b = strtok(NULL, ":");
        if (!netns || !a || !b) { fprintf(stderr, "linkemu: bad link %s\n", argv[argi]); return 2; }
        int fa = open_tap(netns, a), fb = open_tap(netns, b);
        for (int k = 0; k < 2; k++) {
            dir_t *d = &dirs[n_dirs];
            d->in_fd = k ? fb : fa;
            d->out_fd = k ? fa : fb;
            d->ring = mmap(NULL, (size_t)slots * sizeof(slot_t), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (d->ring == MAP_FAILED) die("mmap");
            struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)n_dirs};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, d->in_fd, &ev) < 0) die("epoll_ctl");
            n_dirs++;
        }
        free(spec);
    }
    if (home >= 0) { setns(home, CLONE_NEWNET); close(home); }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 0xfffffffe};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev) < 0) die("epoll_ctl timer");
    ev.data.u32 = 0xffffffff;
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    if (epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev) < 0) die("epoll_ctl stdin");
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    printf("ready\n");
    fflush(stdout);

    char cmd[4096];
    size_t cmd_len = 0;
    uint64_t armed = 0;
    struct epoll_event events[64];
    while (!stop) {
        int n = epoll_wait(ep, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            uint32_t id = events[i].data.u32;
            if (id == 0xfffffffe) {
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) die("timerfd");
                armed = 0;
            } else if (id == 0xffffffff) {
                ssize_t got = read(0, cmd + cmd_len, sizeof cmd - 1 - cmd_len);
                if (got == 0) { stop = 1; break; }
                if (got < 0) { if (errno == EAGAIN || errno == EINTR) continue; die("stdin"); }
                cmd_len += (size_t)got;
                cmd[cmd_len] = 0;
                char *nl;
                while ((nl = strchr(cmd, '\n'))) {
                    *nl = 0;
                    command(cmd);
                    cmd_len -= (size_t)(nl + 1 - cmd);
                    memmove(cmd, nl + 1, cmd_len + 1);
                }
                if (cmd_len == sizeof cmd - 1) cmd_len = 0;  /* an endless line: drop it */
            } else {
                take(&dirs[id], now);
            }
        }
        uint64_t next = release_due(now_ns());
        if (next != armed) {
            struct itimerspec its = {0};
            if (next) {
                its.it_value.tv_sec = (time_t)(next / 1000000000ULL);
                its.it_value.tv_nsec = (long)(next % 1000000000ULL);
            }
            if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
            armed = next;
        }
    }
    return 0;
}
