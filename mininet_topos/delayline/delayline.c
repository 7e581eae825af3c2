/* bwfabric delay line: frames between two interfaces, held for a one-way
 * delay (optionally jittered, never reordered) and optionally gated on/off
 * (VM-scheduling emulation). This kernel has no netem; this is the
 * userspace element the emulation puts in a link instead.
 *
 * One thread per direction: an AF_PACKET socket on the ingress interface
 * (outgoing frames ignored), a FIFO of held frames, transmit on the other
 * interface when due. Waits with ppoll until shortly before the next due
 * frame, then spins, so the hold error stays in tens of microseconds.
 * --spin-us N sets that margin (default 60; 0: no spinning at all -- the
 * line then costs CPU per frame only, not per idle microsecond, which is
 * what a CPU-time measurement of the hosts around it needs).
 * The interfaces need GRO/GSO/TSO off (frames up to --mtu + 18 bytes).
 *
 * usage: delayline --a IF --b IF --delay-us N [--jitter-us N] [--on-ms N
 *        --off-ms N [--off-gap-us N] [--gate ab|ba|both]] [--mtu N] [--slots N]
 *        [--duration-s N] [--spin-us N]
 * --gate: which directions the on/off gate holds (default both; ba: only
 * frames from b to a -- a VM at a that handles what it receives only while
 * it runs, while what it sent already drains).
 * --tos V/M: carry only IPv4 frames whose TOS byte & M == V; --not-tos V/M:
 * every other frame (ARP included). Two lines with complementary filters on
 * the same interfaces give one class of traffic its own delay without
 * holding the other behind it (a classic BPF socket filter: the kernel
 * hands each line only its frames).
 * --step-us N --step-every-s S: the delay grows by N every S seconds.
 * prints one JSON line of statistics on exit (SIGINT/SIGTERM or duration).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

static long long spin_ns = 60000L;   /* ppoll until this close to a due frame, then spin */
#define ERR_SAMPLES 65536

static volatile sig_atomic_t stop_flag;
static long long delay_ns, jitter_ns, on_ns, off_ns, off_gap_ns, t0_ns;
static int mtu = 1500, slots = 4096;
static long long step_ns, step_every_ns;
static int tos_filter;                 /* 0 none, 1 match, -1 exclude */
static unsigned tos_value, tos_mask;

struct frame {
    long long due;
    int len;
    unsigned char *data;
};

struct dir {
    const char *from, *to;
    int rx, tx, tx_ifindex;
    struct frame *q;
    int head, count;
    long long last_due, last_off_send;
    unsigned long long frames, bytes, drops, send_errors;
    long long *err;            /* hold errors (ns): the last ERR_SAMPLES */
    unsigned long long n_err;
    unsigned int seed;
    int gated;                 /* the on/off gate holds this direction */
};

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int gate_dirs = 3;    /* bit 0: a -> b, bit 1: b -> a */

static int gate_open(long long t) {
    if (on_ns <= 0 || off_ns <= 0)
        return 1;
    return ((t - t0_ns) % (on_ns + off_ns)) < on_ns;
}

static long long gate_next_open(long long t) {
    long long period = on_ns + off_ns, phase = (t - t0_ns) % period;
    return phase < on_ns ? t : t + (period - phase);
}

static int open_socket(const char *ifname, int *ifindex_out) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) { perror("socket(AF_PACKET)"); exit(2); }
    int ifindex = if_nametoindex(ifname);
    if (!ifindex) { fprintf(stderr, "delayline: no interface %s\n", ifname); exit(2); }
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex};
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) { perror("bind"); exit(2); }
    if (tos_filter) {
        unsigned in = tos_filter > 0 ? 0xffff : 0, out = tos_filter > 0 ? 0 : 0xffff;
        struct sock_filter code[] = {
            {0x28, 0, 0, 12},                        /* ldh [12]: ethertype */
            {0x15, 0, 3, 0x0800},                    /* IPv4? else not matched */
            {0x30, 0, 0, 15},                        /* ldb [15]: TOS */
            {0x54, 0, 0, tos_mask},                  /* and #mask */
            {0x15, 1, 0, tos_value},                 /* == value: matched */
            {0x06, 0, 0, out},                       /* not matched */
            {0x06, 0, 0, in},                        /* matched */
        };
        struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
        if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) < 0) {
            perror("SO_ATTACH_FILTER"); exit(2);
        }
    }
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0) {
        perror("PACKET_IGNORE_OUTGOING"); exit(2);
    }
    int buf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    *ifindex_out = ifindex;
    return fd;
}

static void transmit(struct dir *d, struct frame *f, long long t) {
    struct sockaddr_ll to = {.sll_family = AF_PACKET, .sll_ifindex = d->tx_ifindex, .sll_halen = ETH_ALEN};
    memcpy(to.sll_addr, f->data, ETH_ALEN);
    if (sendto(d->tx, f->data, f->len, 0, (struct sockaddr *)&to, sizeof to) < 0)
        d->send_errors++;
    d->err[d->n_err++ % ERR_SAMPLES] = t - f->due;
    d->frames++;
    d->bytes += f->len;
}

static void *run(void *arg) {
    struct dir *d = arg;
    int cap = mtu + 18 + 64;
    while (!stop_flag) {
        long long t = now_ns();
        /* send what is due (while the gate is open; a trickle while closed) */
        while (d->count) {
            struct frame *f = &d->q[d->head];
            if (f->due > t)
                break;
            if (d->gated && !gate_open(t)) {
                if (off_gap_ns <= 0 || t - d->last_off_send < off_gap_ns)
                    break;
                d->last_off_send = t;
            }
            transmit(d, f, t);
            d->head = (d->head + 1) % slots;
            d->count--;
        }
        /* receive everything waiting */
        for (;;) {
            int tail = (d->head + d->count) % slots;
            if (d->count == slots) {             /* full: drop at the tail, like a queue */
                unsigned char scratch[65536];
                if (recv(d->rx, scratch, sizeof scratch, MSG_DONTWAIT) < 0)
                    break;
                d->drops++;
                continue;
            }
            struct frame *f = &d->q[tail];
            int n = recv(d->rx, f->data, cap, MSG_DONTWAIT | MSG_TRUNC);
            if (n < 0)
                break;
            if (n > cap) {                       /* a GSO/GRO super-frame: offloads must be off */
                d->drops++;
                continue;
            }
            long long rx = now_ns(), due = rx + delay_ns;
            if (step_ns > 0 && step_every_ns > 0)
                due += step_ns * ((rx - t0_ns) / step_every_ns);
            if (jitter_ns > 0)
                due += (long long)(((double)rand_r(&d->seed) / RAND_MAX) * 2 * jitter_ns) - jitter_ns;
            if (due < d->last_due)
                due = d->last_due;               /* the FIFO never reorders: keep due times honest */
            d->last_due = due;
            f->due = due;
            f->len = n;
            d->count++;
        }
        /* wait: until shortly before the next due frame (or a gate opening), or a new frame */
        t = now_ns();
        long long next = t + 100000000LL;
        if (d->count) {
            next = d->q[d->head].due;
            if (d->gated && !gate_open(next)) {
                long long open_at = gate_next_open(next);
                next = off_gap_ns > 0 ? (d->last_off_send + off_gap_ns < open_at ?
                                         d->last_off_send + off_gap_ns : open_at) : open_at;
            }
        }
        long long wait = next - t - spin_ns;
        if (wait > 0) {
            struct pollfd p = {.fd = d->rx, .events = POLLIN};
            struct timespec ts = {.tv_sec = wait / 1000000000LL, .tv_nsec = wait % 1000000000LL};
            ppoll(&p, 1, &ts, NULL);
        }
    }
    return NULL;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void report(struct dir *d, const char *name, int last) {
    unsigned long long n = d->n_err < ERR_SAMPLES ? d->n_err : ERR_SAMPLES;
    long long med = 0, p99 = 0, mx = 0;
    if (n) {
        qsort(d->err, n, sizeof(long long), cmp_ll);
        med = d->err[n / 2];
        p99 = d->err[(n * 99) / 100];
        mx = d->err[n - 1];
    }
    printf("\"%s\": {\"from\": \"%s\", \"to\": \"%s\", \"frames\": %llu, \"bytes\": %llu, \"drops\": %llu, "
           "\"send_errors\": %llu, \"hold_error_us\": {\"median\": %.1f, \"p99\": %.1f, \"max\": %.1f}}%s",
           name, d->from, d->to, d->frames, d->bytes, d->drops, d->send_errors, med / 1e3, p99 / 1e3, mx / 1e3,
           last ? "" : ", ");
}

static void on_signal(int sig) { (void)sig; stop_flag = 1; }

static void usage(void) {
    fprintf(stderr, "usage: delayline --a IF --b IF --delay-us N [--jitter-us N] [--on-ms N --off-ms N "
                    "[--off-gap-us N] [--gate ab|ba|both]] [--tos V/M | --not-tos V/M] [--step-us N --step-every-s S] [--spin-us N] [--mtu N] [--slots N] [--duration-s N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *a = NULL, *b = NULL;
    double duration = 0;
    long long delay_us = -1;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        const char *k = argv[i], *v = argv[++i];
        char *end;
        double x = strtod(v, &end);
        if (!strcmp(k, "--a")) { a = v; continue; }
        if (!strcmp(k, "--b")) { b = v; continue; }
        if (!strcmp(k, "--tos") || !strcmp(k, "--not-tos")) {
            if (sscanf(v, "%i/%i", (int *)&tos_value, (int *)&tos_mask) != 2 || tos_value > 255 || tos_mask > 255)
                usage();
            tos_filter = !strcmp(k, "--tos") ? 1 : -1;
            continue;
        }
        if (!strcmp(k, "--gate")) {
            if (!strcmp(v, "ab")) gate_dirs = 1;
            else if (!strcmp(v, "ba")) gate_dirs = 2;
            else if (!strcmp(v, "both")) gate_dirs = 3;
            else usage();
            continue;
        }
        if (*end || x != x || x < 0 || x > 1e9) { fprintf(stderr, "delayline: %s %s: not a number >= 0\n", k, v); exit(2); }
        if (!strcmp(k, "--delay-us")) delay_us = (long long)x;
        else if (!strcmp(k, "--jitter-us")) jitter_ns = (long long)(x * 1000);
        else if (!strcmp(k, "--on-ms")) on_ns = (long long)(x * 1e6);
        else if (!strcmp(k, "--off-ms")) off_ns = (long long)(x * 1e6);
        else if (!strcmp(k, "--off-gap-us")) off_gap_ns = (long long)(x * 1000);
        else if (!strcmp(k, "--mtu")) mtu = (int)x;
        else if (!strcmp(k, "--slots")) slots = (int)x;
        else if (!strcmp(k, "--duration-s")) duration = x;
        else if (!strcmp(k, "--step-us")) step_ns = (long long)(x * 1000);
        else if (!strcmp(k, "--step-every-s")) step_every_ns = (long long)(x * 1e9);
        else if (!strcmp(k, "--spin-us")) {
            if (x > 10000) { fprintf(stderr, "delayline: --spin-us %s above 10000\n", v); exit(2); }
            spin_ns = (long long)(x * 1000);
        }
        else usage();
    }
    if (!a || !b || delay_us < 0 || mtu < 68 || mtu > 65535 || slots < 16 || slots > (1 << 20)) usage();
    if (jitter_ns > delay_us * 1000) { fprintf(stderr, "delayline: jitter above the delay\n"); exit(2); }
    delay_ns = delay_us * 1000;
    if (spin_ns == 0)
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);   /* ppoll wakes within ~1 us of its timeout, not 50 */
    t0_ns = now_ns();
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct dir dirs[2] = {{.from = a, .to = b, .seed = 1}, {.from = b, .to = a, .seed = 2}};
    int ifa, ifb;
    int fa = open_socket(a, &ifa), fb = open_socket(b, &ifb);
    dirs[0].rx = fa; dirs[0].tx = fb; dirs[0].tx_ifindex = ifb;
    dirs[1].rx = fb; dirs[1].tx = fa; dirs[1].tx_ifindex = ifa;
    dirs[0].gated = gate_dirs & 1;
    dirs[1].gated = (gate_dirs >> 1) & 1;
    for (int k = 0; k < 2; k++) {
        dirs[k].q = calloc(slots, sizeof(struct frame));
        dirs[k].err = calloc(ERR_SAMPLES, sizeof(long long));
        if (!dirs[k].q || !dirs[k].err) { perror("calloc"); exit(2); }
        for (int s = 0; s < slots; s++)
            if (!(dirs[k].q[s].data = malloc(mtu + 18 + 64))) { perror("malloc"); exit(2); }
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, run, &dirs[k]);
    fprintf(stderr, "delayline: %s <-> %s, %lld us one way\n", a, b, delay_us);
    long long end = duration > 0 ? now_ns() + (long long)(duration * 1e9) : 0;
    while (!stop_flag) {
        usleep(20000);
        if (end && now_ns() >= end) stop_flag = 1;
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    printf("{");
    report(&dirs[0], "a_to_b", 0);
    report(&dirs[1], "b_to_a", 1);
    printf("}\n");
    return 0;
}
