// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_wc: the congestion control of work-conservation (WC) subflows.
 *
 * Reno, except that congestion avoidance grows cwnd by alpha_w segments per
 * RTT instead of one, with alpha_w = A_l^2 / K^2 (Eq. 7 of the BG/WC paper):
 * the K WC subflows of one VM together compete like A_l Reno flows.
 *
 *  - A_l comes from the map bwf_alevel, keyed by the VM's IPv4 address (the
 *    socket's local address, network byte order), fixed point x1024, written
 *    by the host agent. No entry: A_l = 1.
 *  - K is kept here, exactly: bwf_kcount[VM] counts the VM's WC subflows
 *    that are sending (counted at their first congestion-avoidance or
 *    slow-start ACK, uncounted when the socket releases its congestion
 *    control). Subflows that only receive never count.
 *
 * All Mininet hosts share one kernel; keying by local address keeps each
 * VM's parameters its own.
 *
 * Guard against a corrupt slow-start threshold. On this kernel (6.18, x86
 * with SRSO return thunks), entering CWR on an ECN echo now and then left
 * snd_ssthresh = 0x81104110 -- the low half of a kernel return address --
 * although this program's ssthresh() never returned more than a few hundred
 * (counted with a debug map over 9 runs). PRR then computes cwnd as
 * ssthresh x delivered / prior_cwnd: +16 million segments per ACK. The WC
 * subflow, unpaced and with a send buffer sized from that cwnd, took
 * megabytes of its connection's data into a loss storm that stalled the
 * connection's BG subflow for seconds (tcp_probe traces; fig12 min BG
 * 0.87-0.95 in 3 of 9 runs). At every ACK (pkts_acked, cong_avoid) an
 * impossible threshold or window is put back to Reno's value and counted in
 * bwf_wcfix. The corrupt value appears after set_state(CWR) has run (a
 * check there never fired: thresholds and windows were always repaired
 * together, at the next ACK), so the one ACK's PRR burst -- up to the
 * subflow's send buffer, two windows -- still goes out. Its pacing rate
 * (0.8-1.9 GB/s from the corrupt window) no longer does: bwf_sockops bounds
 * WC's pacing rate (see cap_wc_pacing there; MPTCP's scheduler kept it for
 * hundreds of ms), and this program keeps the kernel's internal pacing,
 * which the bound turns on, off (unpaced()). bwf_wcfix[2] counts repairs
 * that found the pacing rate run away.
 *
 * Every ECN mark answered, not one per round trip. Eq. 7 counts on
 * throughput ~ sqrt(alpha_w / p): every mark a flow gets is answered. Reno
 * answers one per round trip (the first ECN echo starts CWR, the rest of
 * that window's echoes are ignored), and the receiver's echo latches until
 * the sender's CWR, so a subflow with a large alpha_w and many marks per
 * round trip is under-cut: measured WC shares went ~ A_l^1.2 instead of A_l
 * (Table 3's A_l = 1.33 VM at 0.11-0.12 of WC for its 0.143). So, on
 * subflows that agreed on ECN (bwf_wc_ecn, both ends ours):
 *  - receiver: every data segment is ACKed at once, its ECN echo the
 *    segment's CE state, so the sender's delivered_ce counts marked
 *    segments, not latched ACKs (and no delayed ACK holds a small window's
 *    slot: see echo_ce);
 *  - sender: when a reduction ends (CA_EVENT_COMPLETE_CWR), every segment
 *    marked during it beyond the first owes W / DEBT_DIV segments of the
 *    growth to come (W: the window the reduction began from; at most
 *    MAX_DEBT_MARKS marks a reduction), paid before the window grows again
 *    (counted in bwf_wcmarks) -- unless half or more of the reduction's
 *    segments came back echoed, which is a peer latching its echo (RFC
 *    3168), not marks.
 *
 * Why owed growth and why W / 8 (measured, bgwc-table3 rows 400/200/- and
 * 400/200/100, 4 runs each, S1's share of WC against A_l's 0.667 / 0.571
 * and S3's against 0.143): a further halving per mark (up to 3) compounds
 * -- k marks cut W to W / 2^k, not by k W / 2 -- and at Table 3's windows
 * (tens of segments, alpha_w up to 28) reductions met 3 marks on average,
 * 39 % of them more than the cap: the larger window was under-cut, S1 over
 * its share in every row of 3 sets (0.70-0.71; error of the mean up to
 * 0.12). Owing W / 2 per mark, the fluid model's cost, over-corrects the
 * other way (S1 0.63, S3 0.18): the emulated AQM marks on the instantaneous
 * queue, and the subflow with the larger alpha_w sends burstier, so meets
 * more marks per segment. W / 4: S1 0.65, S3 0.17; W / 8: S1 0.68 and
 * 0.57, S3 0.15, errors of the mean 0.037 and 0.031.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

#define ALPHA_SCALE 1024ULL

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} bwf_alevel SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} bwf_kcount SEC(".maps");

/* [0] thresholds repaired, [1] windows repaired, [2] windows repaired with
 * the pacing rate run away (above RUNAWAY_PACE: no subflow here comes near),
 * [3] ACKs that found the pacing rate at bwf_sockops' ceiling */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} bwf_wcfix SEC(".maps");

/* [0] reductions that met more than one mark, [1] further marks owed for,
 * [2] reductions that met more than 1 + MAX_DEBT_MARKS (marks lost to the cap),
 * [3] reductions that became loss recoveries (no per-mark debt: see bwf_set_state),
 * [4] segments of growth withheld to pay debts */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} bwf_wcmarks SEC(".maps");

#define TCP_INFINITE_SSTHRESH	0x7fffffff
/* include/net/tcp.h: the receiver echoes ECE while this is set */
#define TCP_ECN_DEMAND_CWR	0x4
#define MAX_DEBT_MARKS		8	/* further marks one reduction may owe for */
#define DEBT_DIV		8	/* a further mark owes W / DEBT_DIV of growth */
/* include/net/tcp.h: ECT on every packet, retransmissions included (DCTCP's flag) */
#define TCP_CONG_NEEDS_ECN	0x2
/* no real window or threshold comes near this (16 M segments = 23 GB) */
#define SANE_MAX		(1U << 24)
/* bytes/s, 1 Gb/s: far above any WC subflow of the testbed (60 Mb/s NICs) */
#define RUNAWAY_PACE		(125000000UL)

struct bwf_ca {
	__u32 counted;
	__u32 key;
	__u64 acc;		/* ACKed segments x alpha_w (x ALPHA_SCALE) towards the next +1 */
	__u32 ce_at_cut;	/* sender: delivered_ce when the current reduction began */
	__u32 delivered_at_cut;	/* sender: delivered then */
	__u32 cut_armed;	/* sender: a reduction is under way */
	__u32 cwnd_at_cut;	/* sender: the window the current reduction began from */
	__u64 debt;		/* sender: segments of growth still owed to marks (x ALPHA_SCALE) */
	__u32 prior_rcv_nxt;	/* receiver: rcv_nxt before the last data segment */
	__u32 ce_state;		/* receiver: the last data segment was CE-marked */
};

extern __u32 tcp_slow_start(struct tcp_sock *tp, __u32 acked) __ksym;
extern __u32 tcp_reno_ssthresh(struct sock *sk) __ksym;
extern __u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;

static __always_inline struct tcp_sock *tcp_sk_of(struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline struct bwf_ca *ca_of(struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline int cwnd_limited(struct tcp_sock *tp)
{
	if (tp->snd_cwnd < tp->snd_ssthresh)
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return !!BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

static __always_inline void count_in(struct sock *sk)
{
	struct bwf_ca *ca = ca_of(sk);
	__u32 key;
	__u64 one = 1, *k;

	if (ca->counted)
		return;
	key = sk->__sk_common.skc_rcv_saddr;
	ca->key = key;
	ca->counted = 1;
	k = bpf_map_lookup_elem(&bwf_kcount, &key);
	if (k) {
		__sync_fetch_and_add(k, 1);
	} else if (bpf_map_update_elem(&bwf_kcount, &key, &one, BPF_NOEXIST)) {
		k = bpf_map_lookup_elem(&bwf_kcount, &key);   /* lost a race: it exists now */
		if (k)
			__sync_fetch_and_add(k, 1);
	}
}

static __always_inline void bump(void *map, __u32 i, __u64 n)
{
	__u64 *p = bpf_map_lookup_elem(map, &i);

	if (p)
		__sync_fetch_and_add(p, n);
}

static __always_inline void fixed(__u32 i)
{
	bump(&bwf_wcfix, i, 1);
}

/* WC is not paced (pacing moved Table 3's shares, see bwf_sockops); the
 * pacing ceiling bwf_sockops sets only bounds sk_pacing_rate -- what MPTCP's
 * scheduler takes for the rate the subflow drains at -- so setting it must
 * not turn the kernel's internal pacing on. */
static __always_inline void unpaced(struct sock *sk)
{
	if (sk->sk_pacing_status == SK_PACING_NEEDED)
		sk->sk_pacing_status = SK_PACING_NONE;
}

/* the last ACK's pacing rate held down by the ceiling (or the ceiling just
 * set below it): how often the bound binds */
static __always_inline void count_at_ceiling(struct sock *sk)
{
	unsigned long ceiling = sk->sk_max_pacing_rate;

	if (ceiling != ~0UL && sk->sk_pacing_rate >= ceiling)
		fixed(3);
}

/* An impossible ssthresh or cwnd back to Reno's halving of the window the
 * reduction started from (prior_cwnd; the current window if that is bogus). */
static __always_inline void repair(struct tcp_sock *tp)
{
	__u32 base = tp->prior_cwnd, half;

	if (base == 0 || base >= SANE_MAX)
		base = tp->snd_cwnd < SANE_MAX ? tp->snd_cwnd : 2;
	half = base >> 1;
	if (half < 2)
		half = 2;
	if (tp->snd_ssthresh != TCP_INFINITE_SSTHRESH && tp->snd_ssthresh >= SANE_MAX) {
		tp->snd_ssthresh = half;
		fixed(0);
	}
	if (tp->snd_cwnd >= SANE_MAX) {
		tp->snd_cwnd = half;
		fixed(1);
		/* the pacing rate the corrupt window left (this ACK's is set later) */
		if (tp->inet_conn.icsk_inet.sk.sk_pacing_rate > RUNAWAY_PACE)
			fixed(2);
	}
}

SEC("struct_ops")
void BPF_PROG(bwf_init, struct sock *sk)
{
	struct bwf_ca *ca = ca_of(sk);

	ca->counted = 0;
	ca->key = 0;
	ca->acc = 0;
	ca->ce_at_cut = 0;
	ca->delivered_at_cut = 0;
	ca->cut_armed = 0;
	ca->cwnd_at_cut = 0;
	ca->debt = 0;
	ca->prior_rcv_nxt = tcp_sk_of(sk)->rcv_nxt;
	ca->ce_state = 0;
}

SEC("struct_ops")
void BPF_PROG(bwf_release, struct sock *sk)
{
	struct bwf_ca *ca = ca_of(sk);
	__u32 key = ca->key;
	__u64 *k;

	if (!ca->counted)
		return;
	ca->counted = 0;
	k = bpf_map_lookup_elem(&bwf_kcount, &key);
	if (k && *k > 0)
		__sync_fetch_and_sub(k, 1);
}

SEC("struct_ops")
void BPF_PROG(bwf_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk_of(sk);
	__u32 key = sk->__sk_common.skc_rcv_saddr;
	__u64 a = ALPHA_SCALE, k = 1, alpha, w, acc, inc, cwnd, *p;
	struct bwf_ca *ca;

	count_in(sk);
	repair(tp);
	if (!cwnd_limited(tp))
		return;
	if (tp->snd_cwnd < tp->snd_ssthresh) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	p = bpf_map_lookup_elem(&bwf_alevel, &key);
	if (p)
		a = *p;
	p = bpf_map_lookup_elem(&bwf_kcount, &key);
	if (p && *p > 0)
		k = *p;
	/* alpha_w = A^2 / K^2, fixed point x ALPHA_SCALE */
	alpha = a * a / (k * k * ALPHA_SCALE);
	if (!alpha)
		return;                 /* A_l = 0: this VM's WC does not grow */
	/* +alpha_w segments per RTT: +1 segment for every cwnd / alpha_w ACKed
	 * segments, counted exactly. (tcp_cong_avoid_ai takes a whole number of
	 * segments per +1: at alpha_w = 28 and cwnd = 140 that is 4, not 4.9,
	 * an increase 23 % too fast.) */
	ca = ca_of(sk);
	w = (__u64)tp->snd_cwnd * ALPHA_SCALE;
	acc = ca->acc + (__u64)acked * alpha;
	if (acc >= w) {
		inc = acc / w;
		acc -= inc * w;
		if (ca->debt) {		/* growth owed to marks: paid first */
			__u64 pay = inc * ALPHA_SCALE < ca->debt ? inc * ALPHA_SCALE : ca->debt;

			ca->debt -= pay;
			inc -= pay / ALPHA_SCALE;
			bump(&bwf_wcmarks, 4, pay / ALPHA_SCALE);
		}
		cwnd = tp->snd_cwnd + inc;
		tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
	}
	ca->acc = acc;
}

SEC("struct_ops")
__u32 BPF_PROG(bwf_ssthresh, struct sock *sk)
{
	struct bwf_ca *ca = ca_of(sk);

	ca->acc = 0;		/* the window is cut: counting starts afresh */
	ca->ce_at_cut = tcp_sk_of(sk)->delivered_ce;	/* this cut answers the marks so far */
	ca->delivered_at_cut = tcp_sk_of(sk)->delivered;
	ca->cwnd_at_cut = tcp_sk_of(sk)->snd_cwnd;
	ca->cut_armed = 1;
	return tcp_reno_ssthresh(sk);
}

/* The receiver's ACKs carry ECE while TCP_ECN_DEMAND_CWR is set. */
static __always_inline void set_echo(struct tcp_sock *tp, __u32 on)
{
	if (on)
		tp->ecn_flags |= TCP_ECN_DEMAND_CWR;
	else
		tp->ecn_flags &= ~TCP_ECN_DEMAND_CWR;
}

/* Receiver: echo ECE on exactly the ACKs of CE-marked segments, and ACK
 * every data segment at once. A delayed ACK (one per two segments) frees
 * the first segment's window slot one inter-arrival gap late: a window of W
 * segments then carries W - 0.5 per round trip. Eq. 7 splits a VM's share
 * among its K subflows, so their windows are small and their gaps long --
 * fig14's S1 with 5 connections had windows of ~6 segments and 2.2 Mb/s a
 * subflow (5.3 ms gaps), S3 31 segments: S1's smoothed RTT read 31.6 ms
 * against S3's 26.6 ms in the same queue, and S1 got 0.305-0.314 of the WC
 * bandwidth for its 1/3 over 150 s runs (~0.5/6 - 0.5/31 = 6.7 % less).
 * ACKed per segment, the srtts matched (21.6 / 21.3 ms) and S1 got 0.33-0.36
 * over 150 s runs. Subflows without ECN (bwf_wc) get no per-segment event
 * here and keep the kernel's delayed ACKs. */
static __always_inline void echo_ce(struct sock *sk, __u32 ce)
{
	struct tcp_sock *tp = tcp_sk_of(sk);
	struct bwf_ca *ca = ca_of(sk);

	/* a delayed ACK pending (before this program saw the subflow) covers
	 * segments of the old state: send it now with the old state's echo */
	if (ca->ce_state != ce && (tp->inet_conn.icsk_ack.pending & ICSK_ACK_TIMER)) {
		set_echo(tp, ca->ce_state);
		bpf_tcp_send_ack(tp, ca->prior_rcv_nxt);
	}
	tp->inet_conn.icsk_ack.pending |= ICSK_ACK_NOW;
	ca->prior_rcv_nxt = tp->rcv_nxt;
	ca->ce_state = ce;
	set_echo(tp, ce);
}

/* Sender, at the end of a reduction: growth owed for every segment marked
 * during it beyond the one the reduction answered. */
static __always_inline void owe_per_mark(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk_of(sk);
	struct bwf_ca *ca = ca_of(sk);
	__u32 extra, delivered;
	__u64 owed, cap;

	if (!ca->cut_armed)
		return;
	ca->cut_armed = 0;
	extra = tp->delivered_ce - ca->ce_at_cut;
	delivered = tp->delivered - ca->delivered_at_cut;
	if (!extra || delivered >= SANE_MAX)
		return;
	/* Half of the reduction's segments or more echoed: a receiver that
	 * latches its echo until the sender's CWR (RFC 3168, not this program)
	 * -- the count is not of marks. Reno's one cut stays. */
	if (2 * extra >= delivered || ca->cwnd_at_cut >= SANE_MAX)
		return;
	/* each further mark owes W / DEBT_DIV of the growth to come (see the
	 * head of this file: further halvings compounded and under-cut the
	 * larger windows) */
	if (extra > MAX_DEBT_MARKS) {
		extra = MAX_DEBT_MARKS;
		bump(&bwf_wcmarks, 2, 1);
	}
	owed = (__u64)extra * ca->cwnd_at_cut * ALPHA_SCALE / DEBT_DIV + ca->debt;
	cap = (__u64)MAX_DEBT_MARKS * ca->cwnd_at_cut * ALPHA_SCALE / DEBT_DIV;
	ca->debt = owed < cap ? owed : cap;
	bump(&bwf_wcmarks, 0, 1);
	bump(&bwf_wcmarks, 1, extra);
}

SEC("struct_ops")
void BPF_PROG(bwf_cwnd_event, struct sock *sk, enum tcp_ca_event ev)
{
	unpaced(sk);
	if (ev == CA_EVENT_ECN_IS_CE || ev == CA_EVENT_ECN_NO_CE)
		echo_ce(sk, ev == CA_EVENT_ECN_IS_CE);
	else if (ev == CA_EVENT_COMPLETE_CWR)
		owe_per_mark(sk);
}

/* A reduction that turns into a loss recovery (or a timeout) owes nothing
 * per mark: during a recovery the sender does not signal CWR again, so a
 * peer that latches its echo (RFC 3168) echoes one mark on every ACK until
 * the recovery ends -- counted as marks, they owed up to MAX_DEBT_MARKS for
 * one mark (the latched-echo test saw 35 extra halvings, as they were then,
 * in a run with tail drops). The loss already halved the window. */
SEC("struct_ops")
void BPF_PROG(bwf_set_state, struct sock *sk, __u8 new_state)
{
	struct bwf_ca *ca = ca_of(sk);

	if (new_state == TCP_CA_Recovery || new_state == TCP_CA_Loss) {
		if (ca->cut_armed)
			bump(&bwf_wcmarks, 3, 1);
		ca->cut_armed = 0;
	}
}

SEC("struct_ops")
__u32 BPF_PROG(bwf_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC("struct_ops")
void BPF_PROG(bwf_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	repair(tcp_sk_of(sk));
	count_at_ceiling(sk);
	unpaced(sk);		/* after bwf_sockops' RTT callback, before this ACK's sends */
}

#define BWF_WC_OPS(var, cc_flags)					\
	SEC(".struct_ops")						\
	struct tcp_congestion_ops var = {				\
		.init		= (void *)bwf_init,			\
		.release	= (void *)bwf_release,			\
		.cong_avoid	= (void *)bwf_cong_avoid,		\
		.ssthresh	= (void *)bwf_ssthresh,			\
		.undo_cwnd	= (void *)bwf_undo_cwnd,		\
		.pkts_acked	= (void *)bwf_pkts_acked,		\
		.cwnd_event	= (void *)bwf_cwnd_event,		\
		.set_state	= (void *)bwf_set_state,		\
		.flags		= cc_flags,				\
		.name		= #var,					\
	}

BWF_WC_OPS(bwf_wc, 0);

/* The same congestion control for subflows that negotiated ECN: every packet
 * ECN-capable, retransmissions included (the kernel clears ECT on them
 * otherwise, and a WC queue's random early drop of a retransmission costs a
 * timeout, during which the connection's BG waits in MPTCP's in-order
 * delivery). Chosen by bwf_sockops once a subflow is established: setting a
 * TCP_CONG_NEEDS_ECN congestion control makes the socket ECT whether or not
 * the peer agreed to ECN, which only an ECN connection may be. */
BWF_WC_OPS(bwf_wc_ecn, TCP_CONG_NEEDS_ECN);
