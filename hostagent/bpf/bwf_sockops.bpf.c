// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_sockops: per-subflow settings for MPTCP connections.
 *
 * The first subflow of an MPTCP connection is the bandwidth-guarantee (BG)
 * subflow: Reno, paced at its share of its VM's guarantee (see pace_bg). Every
 * MP_JOIN subflow is work conservation (WC): bwf_wc (bwf_wc_ecn if it agreed
 * on ECN, see set_wc_cc), and a send buffer that
 * follows its window: 2 x cwnd x (MSS + 1 KiB), about what TCP's own
 * autotuning gives a window (the KiB is a packet's buffer overhead: send
 * buffers count memory, not payload), at least 2 x SNDBUF_MIN, set again at
 * every RTT sample. MPTCP's scheduler hands a subflow data while its send
 * buffer has room; with the namespace's large initial buffer (Eq. 1's B) it
 * parked 0.4-3 MB on a WC subflow draining at a few Mb/s, and the
 * connection's in-order delivery -- BG's data included -- then waited
 * seconds for WC. Sized to its window, WC held about two of its round trips
 * of data; the rest waits at the connection level (tcp_wmem[0], see
 * hostagent.plan) for whichever subflow has room. Of the buffer, at most a
 * quarter window (at least 2 MSS) may be unsent (TCP_NOTSENT_LOWAT, which
 * the scheduler's "memory free" test includes): a window's worth parked
 * behind a full WC queue (200-700 ms round trips at 60 Mb/s) made every WC
 * hole last two round trips or more, and BG's data behind it filled the
 * receiver's window -- 1.5-5.5 MB out of order, BG idle with an open TCP
 * window (adversarial, traced). With it: WC's unsent data 20-60 KB instead
 * of 200-600 KB, at most 0.4 MB out of order; fig12 0.99 in 3 of 3 runs.
 *
 * A VM whose tenant chose a coupled congestion control (bwf_ccsel: 1 LIA,
 * 2 MPTCP-D, 3 LIA-VM, 4 uncoupled Reno; see bwf_coupled.bpf.c) gets it on
 * every subflow, and none of the BG/WC settings below: its subflows are
 * upstream MPTCP's, with their windows coupled.
 *
 * Plain TCP sockets are left alone. Attached to a cgroup v2 directory; MPTCP
 * subflows inherit the cgroup of the socket that created them.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _license[] SEC("license") = "GPL";

#define SOL_SOCKET 1
#define SO_SNDBUF 7
#define SOL_TCP 6
#define TCP_CONGESTION 13
#define SO_MAX_PACING_RATE 47
#define TCP_NOTSENT_LOWAT 25
#define WC_NOTSENT_DIV 4	/* WC's unsent data: at most a quarter window (see size_wc_buffers) */
#define SNDBUF_MIN (32 * 1024)	/* the kernel doubles it: 64 KiB */

/* reused from bwf_wc's pinned maps at load time (bpftool ... map name) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} bwf_bgpace SEC(".maps");

/* bwf_mark's BG buckets (bwf_buckets.h; the marker's pinned map, reused at
 * load time): a VM-pair's entry holds the BG rate its host lets through for
 * that pair -- LRC's per-pair limit of this round, or the pipe model's --
 * and BG to that peer is paced at it (pace_bg), not at the VM's whole
 * guarantee */
#include "bwf_buckets.h"

#ifndef PAIR_PACE_HEADROOM_PCT	/* the hose's ceiling, hostagent.plan.BG_PACE_HEADROOM x 100 (compiled in) */
#define PAIR_PACE_HEADROOM_PCT 100
#endif

/* the VM's coupled congestion control, by hostagent.cc.CC_KINDS' index
 * (written by agents; no entry: BG/WC) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} bwf_ccsel SEC(".maps");

static __always_inline __u32 coupled_kind(struct bpf_sock_ops *skops)
{
	__u32 key = skops->local_ip4, *k = bpf_map_lookup_elem(&bwf_ccsel, &key);

	return k ? *k : 0;
}

static __always_inline void set_coupled(struct bpf_sock_ops *skops, __u32 kind)
{
	char lia[] = "bwf_lia", mptcpd[] = "bwf_mptcpd", liavm[] = "bwf_liavm", reno[] = "reno";

	if (kind == 1)
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, lia, sizeof(lia));
	else if (kind == 2)
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, mptcpd, sizeof(mptcpd));
	else if (kind == 3)
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, liavm, sizeof(liavm));
	else
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, reno, sizeof(reno));
}

static __always_inline int is_join(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct mptcp_sock *msk;

	if (!sk)
		return -1;
	msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return -1;		/* not an MPTCP subflow */
	return msk->first != (struct sock *)sk;
}

/* bwf_wc_ecn if the subflow agreed on (RFC 3168) ECN, else bwf_wc. The
 * former keeps every packet ECT, retransmissions included: the kernel clears
 * ECT on them otherwise, and a WC queue's random early drop of a
 * retransmission costs its subflow a timeout, which its connection's BG
 * waits out in MPTCP's in-order delivery. It can only be chosen once the
 * handshake is over: a TCP_CONG_NEEDS_ECN congestion control set at connect
 * time asks for ECN whatever the host's tcp_ecn, and makes the socket ECT
 * even when the peer refuses ECN (unresponsive to the marks it would get). */
#define ECN_MODE_BITS 3		/* tcp_sock.ecn_flags: 1 = RFC 3168 ECN, 2 = AccECN */
static __always_inline void set_wc_cc(struct bpf_sock_ops *skops)
{
	char wc[] = "bwf_wc";
	char wc_ecn[] = "bwf_wc_ecn";
	struct bpf_sock *sk = skops->sk;
	struct tcp_sock *tp = 0;

	if (sk)
		tp = bpf_skc_to_tcp_sock(sk);
	if (tp && (tp->ecn_flags & ECN_MODE_BITS) == 1)
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, wc_ecn, sizeof(wc_ecn));
	else
		bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, wc, sizeof(wc));
}

/* no real window comes near this: bwf_wc repairs a corrupt one (see its
 * source) at the next ACK; until then the buffer keeps its size */
#define SANE_CWND (1U << 24)

/* a byte count for an int socket option */
static __always_inline int sockopt_int(__u64 v)
{
	return v > 0x3fffffff ? 0x3fffffff : (int)v;
}

/* WC's pacing rate, bounded: at most WC_PACE_CAP_X x the most it may have
 * in flight by its state -- its window, what it has in flight, or (in slow
 * start) the threshold it grows to -- per smoothed RTT, from the last RTT
 * sample taken with a sane window. The kernel's own rate is 1.2x window or
 * flight (2x while below half the threshold), so the bound does not bind
 * -- except on the one ACK after which the kernel's anomaly (see bwf_wc's
 * source) leaves a window of millions of segments: the pacing rate then
 * jumped to 0.8-1.9 GB/s (mptcp tracepoint). MPTCP's scheduler folds a
 * subflow's pacing rate into its estimate only when it hands that subflow
 * data, weighted by what it holds, so the estimate stayed 100-1000x too
 * high for hundreds of ms: the WC subflow always looked the quickest to
 * drain, was picked while its buffer was full, and the scheduler then sent
 * nothing -- BG got no data for 0.47 s (adversarial run, S1 BG 0.69 of its
 * guarantee in one 0.5 s sample). It still binds now and then
 * (bwf_wcfix[3]: 37-75 ACKs per adversarial run, 200-530 per fig14 or
 * Table 3 set). Fig14's S1 with 5 connections, short of its 1:1:1 share
 * with the ceiling (0.28-0.32 of the WC bandwidth for its 1/3), was short
 * of it for another reason: delayed ACKs on its small windows (bwf_wc's
 * echo_ce); with an ACK per segment it got 0.33-0.36 over 150 s runs
 * (sets of 25 s runs: 0.29-0.34, as noisy as before). At 16 x the bound
 * left a runaway rate above 1 Gb/s once in 14 adversarial runs: 4 x it
 * is. The bound is a ceiling only: bwf_wc keeps the kernel's internal
 * pacing off. */
#define WC_PACE_CAP_X 4
static __always_inline void cap_wc_pacing(struct bpf_sock_ops *skops, __u64 cwnd, __u64 mss)
{
	__u64 srtt_us = skops->srtt_us >> 3, out = skops->packets_out, ssthresh = skops->snd_ssthresh, rate;
	int val;

	if (!srtt_us || !mss || out >= SANE_CWND)
		return;
	if (out > cwnd)
		cwnd = out;
	if (ssthresh < SANE_CWND && ssthresh > cwnd)	/* not the initial (infinite) one */
		cwnd = ssthresh;
	rate = WC_PACE_CAP_X * cwnd * mss * 1000000 / srtt_us;
	val = sockopt_int(rate);
	bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &val, sizeof(val));
}

/* WC's send buffer, and how much of it may be unsent, follow its window;
 * its pacing rate is bounded (above) */
static __always_inline void size_wc_buffers(struct bpf_sock_ops *skops)
{
	__u64 cwnd = skops->snd_cwnd, mss = skops->mss_cache, want;
	int val;

	if (cwnd >= SANE_CWND)
		return;
	cap_wc_pacing(skops, cwnd, mss);
	want = cwnd * (mss + 1024);	/* x2 by the kernel */
	val = sockopt_int(want);

	if (val < SNDBUF_MIN)
		val = SNDBUF_MIN;
	bpf_setsockopt(skops, SOL_SOCKET, SO_SNDBUF, &val, sizeof(val));
	/* and of it, at most a quarter window not yet sent (at least 2 MSS) */
	want = cwnd * mss / WC_NOTSENT_DIV;
	if (want < 2 * mss)
		want = 2 * mss;
	val = sockopt_int(want);
	bpf_setsockopt(skops, SOL_TCP, TCP_NOTSENT_LOWAT, &val, sizeof(val));
}

/* BG's pacing: what MPTCP's scheduler takes for the rate a subflow drains
 * at (lowest wmem / pacing rate first, nothing sent when that subflow's
 * buffer is full). The host's HTB holds a VM's BG at its guarantee; the
 * pacing rate has to say what this subflow gets of it. Unpaced it was
 * 2 x cwnd / srtt, 1.5-3x the guarantee: the scheduler kept picking a full
 * BG subflow, and the WC subflow had nothing to send 30-80 % of the time.
 * So a VM's only BG subflow is paced at its guarantee (bwf_bgpace;
 * no entry: left alone) -- or, towards a peer whose VM-pair has a BG limit
 * of its own (LRC's, the pipe model's: bwf_mark's pair bucket), at that
 * limit: paced at the whole guarantee, a pair held to a fraction of
 * it let MPTCP park data on a BG subflow that drains slower than its
 * pacing rate says.
 *
 * A VM with n > 1 connections sending long flows (each past BG_PACE_AFTER
 * acknowledged, see pace_bg) shares its guarantee among their n BG subflows.
 * Each paced at the whole guarantee and holding the namespace's send
 * buffer (Eq. 1's B, megabytes), fig14's S1 with 5 connections parked
 * 0.4-2.2 MB on each BG subflow draining at 2 Mb/s -- MPTCP also pushes
 * data on a subflow its ACKs freed room on, before asking the scheduler --
 * so the connection's send buffer was full of BG's data and its WC subflows
 * had nothing to send in 29 % of the samples: S1 took 0.09-0.26 of the WC
 * bandwidth for its 1/3. There, each BG subflow is paced at its share:
 * 1.25 x what it last delivered (the kernel's delivery-rate sample; the
 * 1.25 lets it take a growing share within a few round trips, when another
 * connection idles), at least guarantee / n and at most the guarantee; and
 * its send buffer holds a round trip (srtt, which includes the host HTB's
 * queue) at that rate. A VM's only BG keeps the default send buffer: sized
 * to its round trip, the BG subflows of fig12 swung +-5 % (0.90-0.95 of
 * the guarantee in 0.5 s samples, against 0.98-0.99). WC subflows are not
 * paced: a ceiling at the NIC rate (which turns on the kernel's internal
 * pacing) moved Table 3's WC shares from 0.105 to 0.247 max relative
 * error. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);		/* VM's IPv4 */
	__type(value, __u32);		/* its established BG subflows */
} bwf_bgcount SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u32);		/* the VM (IPv4) this BG subflow is counted for */
} bwf_bgsk SEC(".maps");


static __always_inline void count_bg(struct bpf_sock_ops *skops)
{
	__u32 key = skops->local_ip4, one = 1, *n, *mine;
	struct bpf_sock *sk = skops->sk;

	if (!sk)
		return;
	mine = bpf_sk_storage_get(&bwf_bgsk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!mine || *mine)
		return;
	*mine = key ? key : 1;
	n = bpf_map_lookup_elem(&bwf_bgcount, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
	else if (bpf_map_update_elem(&bwf_bgcount, &key, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&bwf_bgcount, &key);	/* lost a race: it exists now */
		if (n)
			__sync_fetch_and_add(n, 1);
	}
}

static __always_inline void uncount_bg(struct bpf_sock_ops *skops)
{
	__u32 key, *n, *mine;
	struct bpf_sock *sk = skops->sk;

	if (!sk)
		return;
	mine = bpf_sk_storage_get(&bwf_bgsk, sk, 0, 0);
	if (!mine || !*mine)
		return;
	key = *mine == 1 ? 0 : *mine;
	*mine = 0;
	n = bpf_map_lookup_elem(&bwf_bgcount, &key);
	if (n && *n)
		__sync_fetch_and_add(n, -1);
}

static __always_inline void size_bg_sndbuf(struct bpf_sock_ops *skops, __u64 rate)
{
	__u64 srtt_us = skops->srtt_us >> 3, mss = skops->mss_cache, want;
	int val;

	if (!srtt_us || !mss)
		return;
	want = rate * srtt_us / 1000000 * (mss + 1024) / mss;	/* x2 by the kernel */
	val = sockopt_int(want);
	if (val < SNDBUF_MIN)
		val = SNDBUF_MIN;
	bpf_setsockopt(skops, SOL_SOCKET, SO_SNDBUF, &val, sizeof(val));
}

/* ...from the subflow's first BG_PACE_AFTER bytes acknowledged on: before
 * that, a short flow's BG runs unpaced, and what its VM's bucket does not
 * hold is demoted to WC at the host (bwf_mark) and takes whatever the fabric
 * has spare -- as fast as under best effort on an idle fabric -- instead of
 * waiting at the guarantee (a 10 KB flow's second jumbo segment 140 ms
 * behind its first at 0.5 Mb/s). Long flows are paced after it, as above.
 * The agent's plan compiles it in (hostagent.plan.BG_PACE_AFTER_BYTES). */
#ifndef BG_PACE_AFTER
#define BG_PACE_AFTER (1 << 20)
#endif
static __always_inline void pace_bg(struct bpf_sock_ops *skops)
{
	__u32 key = skops->local_ip4, *n;
	__u64 *ceiling = bpf_map_lookup_elem(&bwf_bgpace, &key);
	__u64 rate, drain, floor;
	int val;

	struct bwf_key pair = { .src = skops->local_ip4, .dst = skops->remote_ip4 };
	struct bwf_rate *bucket;

	if (!ceiling || skops->bytes_acked < BG_PACE_AFTER)
		return;
	/* counted among the VM's BG senders from here on (once: count_bg keeps
	 * a mark on the socket): a subflow that only receives -- the accepted
	 * side of a peer's transfer -- or sends a short flow never shares its
	 * VM's guarantee. Counted from the handshake, every analytics VM of the
	 * main job, sending one transfer and receiving one, paced its only
	 * sending BG subflow at half its guarantee. */
	count_bg(skops);
	rate = *ceiling;
	/* a VM-pair with a BG limit of its own: paced at it (the LRC round's
	 * rate, read at every round trip: a changed limit takes effect within one) */
	bucket = bpf_map_lookup_elem(&bwf_bgrate, &pair);
	if (bucket && bucket->rate && bucket->rate * PAIR_PACE_HEADROOM_PCT / 100 < rate)
		rate = bucket->rate * PAIR_PACE_HEADROOM_PCT / 100;
	n = bpf_map_lookup_elem(&bwf_bgcount, &key);
	if (n && *n > 1) {
		floor = rate / *n;
		drain = floor;
		if (skops->rate_delivered && skops->rate_interval_us)
			drain = (__u64)skops->rate_delivered * skops->mss_cache * 1000000 / skops->rate_interval_us * 5 / 4;
		if (drain < floor)
			drain = floor;
		if (drain < rate)
			rate = drain;
	}
	val = rate > 0x7fffffff ? 0x7fffffff : (int)rate;
	bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &val, sizeof(val));
	if (n && *n > 1)
		size_bg_sndbuf(skops, rate);
}

SEC("sockops")
int bwf_sockops(struct bpf_sock_ops *skops)
{
	char bg[] = "reno";
	__u32 kind;
	int join;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		join = is_join(skops);
		if (join < 0)
			return 1;
		kind = coupled_kind(skops);
		if (kind) {
			set_coupled(skops, kind);
			return 1;
		}
		/* a joining WC subflow gets its congestion control once
		 * established, when it is known whether ECN was agreed */
		if (join && skops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
			set_wc_cc(skops);
		else if (!join)
			bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, bg, sizeof(bg));
		/* MPTCP subflows only: no lookup per ACK for plain TCP */
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG |
					  BPF_SOCK_OPS_STATE_CB_FLAG);
		return 1;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		join = is_join(skops);
		if (join >= 0 && coupled_kind(skops))
			return 1;
		if (join == 1) {
			set_wc_cc(skops);
			size_wc_buffers(skops);
		} else if (join == 0) {
			pace_bg(skops);
		}
		return 1;
	case BPF_SOCK_OPS_STATE_CB:	/* enabled on MPTCP subflows only (above) */
		if (skops->args[1] == BPF_TCP_CLOSE)
			uncount_bg(skops);
		return 1;
	case BPF_SOCK_OPS_RTT_CB:	/* enabled on MPTCP subflows only (above) */
		if (is_join(skops) == 1)
			size_wc_buffers(skops);
		else
			pace_bg(skops);
		return 1;
	}
	return 1;
}
