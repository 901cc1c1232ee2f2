/*
 * nfq_delay: a userspace delay element for kernels without sch_netem.
 *
 * Binds one or more NFQUEUE queues in the current network namespace and holds
 * every queued packet for a fixed one-way delay (plus optional jitter) before
 * accepting it. Jitter never reorders packets: a packet's release time is
 * max(arrival + delay + U(-jitter, +jitter), previous release time), so each
 * queue stays FIFO (unlike netem, whose jitter reorders; see tc-netem(8)).
 *
 * Usage: nfq_delay --queue NUM:DELAY_US:JITTER_US:MAXLEN[:LOSS_PPM] [--queue ...] [--seed N]
 *                  [--control PATH]
 *
 * LOSS_PPM drops that many packets per million on arrival (a DROP verdict at once). With
 * --control, a Unix datagram socket bound at PATH takes live changes, one per datagram:
 * "set NUM DELAY_US JITTER_US LOSS_PPM"; the element answers "ok" (or "error: why") to the
 * sender's address where it has one. A change applies to packets arriving after it; since a
 * release time is never earlier than the previous packet's, a shorter delay never reorders:
 * packets arriving after a decrease wait behind those already held (the delay ramps down over
 * one old delay).
 *
 * Prints "ready" on stdout once every queue is bound, then runs until SIGTERM or
 * SIGINT, and prints one line of counters per queue on stderr when it exits:
 * packets, most packets held at once, how late packets were released (mean,
 * p99 from a histogram of power-of-two microsecond buckets, max), and how many
 * carried the kernel's receive time stamp (their delay counts from it).
 *
 * On a busy machine the element's wake-ups compete with the traffic's own
 * senders and receivers; a late wake-up adds its lateness to every packet
 * released by it. It therefore asks for a modest real-time priority
 * (SCHED_FIFO 10, --rt-priority 0 to keep the default policy) and for 1 us
 * timer slack. Timed wake-ups still come tens of microseconds late in a VM, so
 * it wakes early by their running mean lateness and waits out what is left of
 * the release time on the clock (at most 60 us per wake-up: it cannot starve
 * the machine, and the kernel's RT throttling still holds); no packet is ever
 * released before its time.
 * Install the iptables NFQUEUE rules only after "ready", and without
 * --queue-bypass: if this process dies, queued traffic is dropped (fails
 * closed) instead of silently passing undelayed (DESIGN.md section 3).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif
#define MAX_QUEUES 64

struct held { uint32_t id; uint64_t release_ns; };

struct queue {
    uint16_t num;
    uint64_t delay_ns, jitter_ns;
    uint32_t maxlen, loss_ppm;
    struct nfq_q_handle *qh;
    struct held *ring;
    size_t cap, head, len;
    uint64_t last_release_ns;
    uint64_t packets, max_held, stamped, dropped, changes;
    uint64_t late_sum_ns, late_max_ns, late_hist[40]; /* late_hist[k]: lateness in [2^k - 1, 2^(k+1) - 1) us */
};

static struct queue queues[MAX_QUEUES];
static int nqueues;
static volatile sig_atomic_t stop;
static int rt_priority = 10;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
/* How late timed wake-ups come, as an exponentially weighted mean (ns); the element wakes that
   much before a release time, at most WAKE_EARLY_MAX_NS, and spins at most SPIN_MAX_NS of the rest. */
static uint64_t wake_late_ns = 20000;
#define WAKE_EARLY_MAX_NS 60000ull
#define SPIN_MAX_NS WAKE_EARLY_MAX_NS

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC (ns), refreshed before each batch of received packets:
   the kernel stamps a packet's arrival in real time (NFQA_TIMESTAMP), the element keeps time in
   monotonic time. */
static int64_t real_minus_mono_ns;

static void refresh_clock_offset(void) {
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    real_minus_mono_ns = ((int64_t)r.tv_sec - (int64_t)m.tv_sec) * 1000000000ll + (r.tv_nsec - m.tv_nsec);
}

/* When the packet reached the namespace: the kernel's receive stamp (set once any socket asks for
   timestamps; main() asks), converted to monotonic time, so that the time the packet waited for
   this process to wake and read it is part of its delay and not added to it. Falls back to now. */
static uint64_t arrival_ns(struct nfq_data *nfa, uint64_t now, uint64_t *stamped) {
    struct timeval tv;
    if (nfq_get_timestamp(nfa, &tv) != 0) return now;
    int64_t t = ((int64_t)tv.tv_sec * 1000000 + tv.tv_usec) * 1000 - real_minus_mono_ns;
    if (t <= 0 || (uint64_t)t > now || now - (uint64_t)t > 1000000000ull) return now; /* clock stepped */
    (*stamped)++;
    return (uint64_t)t;
}

static uint64_t xorshift64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void die(const char *what) {
    fprintf(stderr, "nfq_delay: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void push(struct queue *q, uint32_t id, uint64_t release_ns) {
    if (q->len == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 4096;
        struct held *n = malloc(ncap * sizeof(*n));
        if (!n) die("malloc");
        for (size_t i = 0; i < q->len; i++) n[i] = q->ring[(q->head + i) % q->cap];
        free(q->ring);
        q->ring = n; q->cap = ncap; q->head = 0;
    }
    q->ring[(q->head + q->len) % q->cap] = (struct held){id, release_ns};
    q->len++;
    if (q->len > q->max_held) q->max_held = q->len;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg,
                     struct nfq_data *nfa, void *data) {
    (void)qh; (void)msg;
    struct queue *q = data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    if (q->loss_ppm && xorshift64() % 1000000u < q->loss_ppm) {
        if (nfq_set_verdict(q->qh, ntohl(ph->packet_id), NF_DROP, 0, NULL) < 0) die("nfq_set_verdict");
        q->dropped++;
        return 0;
    }
    uint64_t t = arrival_ns(nfa, now_ns(), &q->stamped) + q->delay_ns;
    if (q->jitter_ns) {
        int64_t j = (int64_t)(xorshift64() % (2 * q->jitter_ns + 1)) - (int64_t)q->jitter_ns;
        t = (j < 0 && (uint64_t)(-j) > t) ? 0 : t + j;
    }
    if (t < q->last_release_ns) t = q->last_release_ns; /* FIFO: never reorder */
    q->last_release_ns = t;
    push(q, ntohl(ph->packet_id), t);
    q->packets++;
    return 0;
}

/* Accept every held packet whose release time has come; return the next release time. */
static uint64_t release_due(uint64_t now) {
    uint64_t next = UINT64_MAX;
    for (int i = 0; i < nqueues; i++) {
        struct queue *q = &queues[i];
        uint32_t last = 0; int any = 0;
        while (q->len && q->ring[q->head].release_ns <= now) {
            uint64_t late = now - q->ring[q->head].release_ns;
            q->late_sum_ns += late;
            if (late > q->late_max_ns) q->late_max_ns = late;
            int k = 0;
            for (uint64_t us = late / 1000 + 1; us > 1 && k < 39; us >>= 1) k++;
            q->late_hist[k]++;
            last = q->ring[q->head].id; any = 1;
            q->head = (q->head + 1) % q->cap; q->len--;
        }
        /* ids grow in arrival order and release order is arrival order, so one
           batch verdict accepts every due packet of this queue */
        if (any && nfq_set_verdict_batch(q->qh, last, NF_ACCEPT) < 0)
            die("nfq_set_verdict_batch");
        if (q->len && q->ring[q->head].release_ns < next) next = q->ring[q->head].release_ns;
    }
    return next;
}

static void on_signal(int sig) { (void)sig; stop = 1; }

/* Upper edge (us) of the histogram bucket holding the 99th percentile of lateness. */
static uint64_t late_p99_us(const struct queue *q) {
    uint64_t released = 0, seen = 0;
    for (int k = 0; k < 40; k++) released += q->late_hist[k];
    if (!released) return 0;
    for (int k = 0; k < 40; k++) {
        seen += q->late_hist[k];
        if (seen * 100 >= released * 99) return (2ull << k) - 1;
    }
    return q->late_max_ns / 1000;
}

static void parse_queue(const char *arg) {
    if (nqueues == MAX_QUEUES) { fprintf(stderr, "nfq_delay: too many queues\n"); exit(2); }
    unsigned num; unsigned long long d, j; unsigned maxlen, loss = 0;
    int n = sscanf(arg, "%u:%llu:%llu:%u:%u", &num, &d, &j, &maxlen, &loss);
    if (n < 4 || num > 65535 || maxlen == 0 || loss >= 1000000) {
        fprintf(stderr, "nfq_delay: bad --queue '%s' (want NUM:DELAY_US:JITTER_US:MAXLEN[:LOSS_PPM])\n", arg);
        exit(2);
    }
    struct queue *q = &queues[nqueues++];
    memset(q, 0, sizeof(*q));
    q->num = (uint16_t)num; q->delay_ns = d * 1000ull; q->jitter_ns = j * 1000ull; q->maxlen = maxlen;
    q->loss_ppm = loss;
}

/* One control datagram: "set NUM DELAY_US JITTER_US LOSS_PPM". Answers the sender. */
static void on_control(int cfd) {
    char msg[256], reply[128];
    struct sockaddr_un from;
    socklen_t fromlen = sizeof(from);
    ssize_t n = recvfrom(cfd, msg, sizeof(msg) - 1, MSG_DONTWAIT, (struct sockaddr *)&from, &fromlen);
    if (n <= 0) return;
    msg[n] = 0;
    unsigned num, loss; unsigned long long d, j;
    struct queue *q = NULL;
    if (sscanf(msg, "set %u %llu %llu %u", &num, &d, &j, &loss) == 4 && loss < 1000000) {
        for (int i = 0; i < nqueues; i++)
            if (queues[i].num == num) q = &queues[i];
    }
    if (!q) {
        snprintf(reply, sizeof(reply), "error: want 'set NUM DELAY_US JITTER_US LOSS_PPM' for a queue served here");
    } else {
        q->delay_ns = d * 1000ull; q->jitter_ns = j * 1000ull; q->loss_ppm = loss; q->changes++;
        snprintf(reply, sizeof(reply), "ok");
    }
    if (fromlen > sizeof(sa_family_t))
        sendto(cfd, reply, strlen(reply), MSG_DONTWAIT, (struct sockaddr *)&from, fromlen);
}

int main(int argc, char **argv) {
    const char *control_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--queue") && i + 1 < argc) parse_queue(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], 0, 10) | 1;
        else if (!strcmp(argv[i], "--rt-priority") && i + 1 < argc) rt_priority = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--control") && i + 1 < argc) control_path = argv[++i];
        else {
            fprintf(stderr, "usage: nfq_delay --queue NUM:DELAY_US:JITTER_US:MAXLEN[:LOSS_PPM] ... [--seed N] "
                            "[--rt-priority P] [--control PATH]\n");
            return 2;
        }
    }
    if (!nqueues) { fprintf(stderr, "nfq_delay: no --queue given\n"); return 2; }
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake within ~1 us, not the default 50 us */
    if (rt_priority > 0) {
        struct sched_param sp = {.sched_priority = rt_priority};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
            fprintf(stderr, "nfq_delay: SCHED_FIFO %d refused (%s): running at the default priority\n",
                    rt_priority, strerror(errno));
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, 0); sigaction(SIGINT, &sa, 0);

    struct nfq_handle *h = nfq_open();
    if (!h) die("nfq_open");
    for (int i = 0; i < nqueues; i++) {
        struct queue *q = &queues[i];
        q->qh = nfq_create_queue(h, q->num, &on_packet, q);
        if (!q->qh) die("nfq_create_queue (is another process bound to this queue?)");
        if (nfq_set_mode(q->qh, NFQNL_COPY_META, 0) < 0) die("nfq_set_mode");
        if (nfq_set_queue_maxlen(q->qh, q->maxlen) < 0) die("nfq_set_queue_maxlen");
        /* hand over GSO packets unsegmented: we never touch the payload */
        nfq_set_queue_flags(q->qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
    }
    /* ask the kernel to stamp received packets (net_enable_timestamp: a global switch, on while
       this socket lives); NFQUEUE then hands each packet's arrival time over */
    int stamp_fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (stamp_fd < 0 || setsockopt(stamp_fd, SOL_SOCKET, SO_TIMESTAMPNS, &(int){1}, sizeof(int)) < 0)
        fprintf(stderr, "nfq_delay: cannot enable receive timestamps (%s): delays count from when packets are read\n",
                strerror(errno));
    int fd = nfq_fd(h);
    int one = 1, rcvbuf = 64 << 20;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int cfd = -1;
    if (control_path) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(control_path) >= sizeof(addr.sun_path)) { fprintf(stderr, "nfq_delay: --control path too long\n"); return 2; }
        strcpy(addr.sun_path, control_path);
        unlink(control_path);
        cfd = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (cfd < 0 || bind(cfd, (struct sockaddr *)&addr, sizeof(addr)) < 0) die("control socket");
    }
    printf("ready\n");
    fflush(stdout);

    static char buf[1 << 16];
    while (!stop) {
        uint64_t next = release_due(now_ns()), target = 0;
        struct pollfd p[2] = {{fd, POLLIN, 0}, {cfd, POLLIN, 0}};
        struct timespec ts, *tsp = NULL;
        if (next != UINT64_MAX) {
            /* wake early by how late timed wake-ups have come, so that packets leave on time on
               average instead of one wake-up latency late */
            uint64_t n = now_ns(), early = wake_late_ns < WAKE_EARLY_MAX_NS ? wake_late_ns : WAKE_EARLY_MAX_NS;
            target = next > early ? next - early : 0;
            uint64_t wait = target > n ? target - n : 0;
            ts.tv_sec = wait / 1000000000ull; ts.tv_nsec = wait % 1000000000ull;
            tsp = &ts;
        }
        int r = ppoll(p, cfd >= 0 ? 2 : 1, tsp, NULL);
        if (r < 0) { if (errno == EINTR) continue; die("ppoll"); }
        if (r == 0 && tsp) {
            uint64_t w = now_ns();
            if (ts.tv_sec || ts.tv_nsec) {
                /* a real timed sleep: learn how late it woke (one stall counts at most the cap) */
                uint64_t late = w > target ? w - target : 0;
                if (late > WAKE_EARLY_MAX_NS) late = WAKE_EARLY_MAX_NS;
                wake_late_ns = (7 * wake_late_ns + late) / 8;
            }
            /* woke before the release time: wait out the rest on the clock (at most the early
               margin, so at most SPIN_MAX_NS; never release early) */
            while (w < next && next - w <= SPIN_MAX_NS) w = now_ns();
        }
        if (r > 0 && cfd >= 0 && (p[1].revents & POLLIN)) on_control(cfd);
        if (r > 0 && (p[0].revents & POLLIN)) {
            for (;;) {
                ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
                if (n < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
                    if (errno == ENOBUFS) continue;
                    die("recv");
                }
                refresh_clock_offset();
                nfq_handle_packet(h, buf, (int)n);
            }
        }
    }
    for (int i = 0; i < nqueues; i++) {
        const struct queue *q = &queues[i];
        uint64_t released = 0;
        for (int k = 0; k < 40; k++) released += q->late_hist[k];
        fprintf(stderr,
                "queue %u packets %llu max_held %llu late_mean_us %.1f late_p99_us %llu late_max_us %llu stamped %llu "
                "dropped %llu changes %llu\n",
                q->num, (unsigned long long)q->packets, (unsigned long long)q->max_held,
                released ? q->late_sum_ns / 1e3 / released : 0.0, (unsigned long long)late_p99_us(q),
                (unsigned long long)(q->late_max_ns / 1000), (unsigned long long)q->stamped,
                (unsigned long long)q->dropped, (unsigned long long)q->changes);
        nfq_destroy_queue(queues[i].qh);
    }
    nfq_close(h);
    if (control_path) unlink(control_path);
    return 0;
}
