// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_coupled: coupled congestion controls for MPTCP subflows (issue #23).
 * Upstream Linux has none (no LIA, OLIA, BALIA); these are struct_ops
 * tcp_congestion_ops, one object registering three:
 *
 *  - bwf_lia    LIA (RFC 6356): in congestion avoidance an ACK of `acked`
 *               segments on subflow r adds acked * min(alpha / w_total,
 *               1 / w_r), alpha = w_total * max_i(w_i / srtt_i^2) /
 *               (sum_i w_i / srtt_i)^2.
 *  - bwf_mptcpd MPTCP-D (Zhao et al.): adds acked * psi_r * w_r / rtt_r^2 /
 *               (sum_k w_k / rtt_k)^2, psi_r = min_k rtt_k / rtt_r, over the
 *               latest RTT samples, uncapped; plus extra-subflow elimination
 *               (ESE, below).
 *  - bwf_liavm  LIA that does not take a descheduled VM for congestion (Ha
 *               and Xu): a sample D with D / minRTT_r > theta is an
 *               off-period -- srtt is not updated with it and alpha is the
 *               largest alpha of the last delta.
 *
 * bwtesting/coupled_models.py is the reference of all three, and decides
 * what the papers leave open; tests replay what this program recorded
 * (bwf_cctrace) through it.
 *
 * The connection. A subflow's context (icsk_ulp_data) points at its MPTCP
 * socket, whose conn_list links the sibling contexts. No helper may take
 * these pointers in a congestion control (bpf_skc_to_mptcp_sock and
 * bpf_mptcp_sock_from_subflow are refused here), so they are read through
 * bpf_rdonly_cast: loads that cannot fault the kernel (a bad one reads 0),
 * racy while subflows come and go -- every value read is checked (windows
 * within MAX_W, a sibling counted only if it runs this same congestion
 * control, is established and not closing by ESE, and has an RTT).
 *
 * The sRTT. Each subflow keeps its own EWMA of its RTT samples (gamma 7/8,
 * in 1/8 us), not the kernel's srtt_us: LIA-VM must leave out the samples of
 * off-periods, and the model then sees exactly what this program used.
 * Siblings read it from each other's icsk_ca_priv.
 *
 * Arithmetic. With rho_k = rtt_min / rtt_k (Q20), alpha / w_total = M / S^2
 * (M = max_k w_k rho_k^2, S = sum_k w_k rho_k) and MPTCP-D's increase is
 * w_r rho_r^3 / S^2: rtt_min cancels, every term is <= the window, and u64
 * holds each step for windows up to MAX_W. The window keeps its fraction
 * (Q30) between ACKs.
 *
 * ESE (MPTCP-D only). Per connection (bwf_ccconn, LRU, keyed by the MPTCP
 * socket's address and token): the first subflow whose sample exceeds
 * ese_alpha x its least sample, during its first ese_candidates samples,
 * raises TRIG and becomes the reference subflow; another such subflow
 * within ese_beta x its least sample of the reference subflow's latest
 * sample shares the bottleneck: it is
 * marked closing (left out of every sibling's sums from then on) and
 * entered in bwf_ccese. The connection's first subflow is never closed
 * (with it destroyed, a connection of 8 subflows stalled for minutes once in
 * 5 runs). The paper's reference is the one sample that set
 * TRIG (CONF_ESE_FROZEN): a subflow that joins later meets a queue that
 * has grown since, and on the testbed no shared-bottleneck subflow was
 * closed (0 of 4 runs at 0.5 and 5 ms RTT); against the reference
 * subflow's latest sample, 4 of 4 at 5 ms and none of the disjoint ones
 * (docs/coupled.md has the measured rates). And a subflow is closed after
 * 4 consecutive matching samples (CONF_ESE_CONFIRM; the paper: 1): on two
 * disjoint paths alike in rate and delay a joining subflow's RTT, ramping
 * up, crossed the reference's within beta x base for a sample or two, and
 * one match closed the only subflow of a path in 3 of 10 runs. A congestion control cannot close
 * its own socket: the host agent destroys the subflow (SOCK_DESTROY).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

char _license[] SEC("license") = "GPL";

#define KIND_LIA	1
#define KIND_MPTCPD	2
#define KIND_LIAVM	3

#define MAX_SUB		9		/* the first subflow and at most 8 more */
#define MAX_W		(1U << 16)	/* windows above this are not real here: the sibling is skipped */
#define Q20		20
#define Q30		30
#define NBUCKETS	8		/* LIA-VM: the last delta kept as 8 buckets of delta / 8 */

/* settings the agent writes (array, u64 each): */
#define CONF_TRACE	0	/* 1: record every sample, increase, loss and ESE decision in bwf_cctrace */
#define CONF_ESE_ALPHA	1	/* x 1000; 0: default 1300 */
#define CONF_ESE_BETA	2	/* x 1000; 0: default 100 */
#define CONF_ESE_N	3	/* candidate samples; 0: default 80 */
#define CONF_THETA	4	/* x 1000; 0: default 10000 */
#define CONF_DELTA_MS	5	/* 0: default 1000 */
#define CONF_ESE_OFF	6	/* 1: MPTCP-D without ESE */
#define CONF_ESE_FROZEN	7	/* 1: the reference is the sample that set TRIG (the paper's Alg. 1), not the
				 * reference subflow's latest sample (see the header) */
#define CONF_ESE_CONFIRM	8	/* consecutive matching samples before a closing; 0: default 4 (the paper: 1) */
#define CONF_N		9

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONF_N);
	__type(key, __u32);
	__type(value, __u64);
} bwf_ccconf SEC(".maps");

/* [0] increases, [1] siblings skipped by a read that failed a check,
 * [2] ESE closings, [3] off-periods (LIA-VM), [4] trace records lost (ring full) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} bwf_ccstat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} bwf_cctrace SEC(".maps");

/* subflows ESE closes, for the host agents to destroy: a hash, not a ring
 * buffer -- emulated hosts share one kernel, each agent takes the entries
 * of its own addresses (a ring buffer's record goes to one reader) */
struct ese_key {
	__u32 saddr;		/* network order */
	__u32 daddr;
	__u16 sport;		/* host order */
	__u16 dport;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ese_key);
	__type(value, struct ese_event);
} bwf_ccese SEC(".maps");

struct conn_key {
	__u64 msk;
	__u32 token;
	__u32 pad;
};

struct conn_state {
	__u32 trig;
	__u32 ref_rtt;		/* us */
	__u32 ref_sub;		/* subflow_id */
	__u32 closed;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, struct conn_state);
} bwf_ccconn SEC(".maps");

/* The private state, in icsk_ca_priv (13 u64). Words 1 and 2 are read by
 * the siblings; their layout is fixed (see siblings()). */
struct bwf_cc {
	__u64 frac;		/* word 0: the window's fraction, Q30 */
	__u32 srtt8;		/* word 1 lo: our sRTT x 8, us; 0 = no sample yet */
	__u32 rtt;		/* word 1 hi: the latest sample, us */
	__u32 min_rtt;		/* word 2 lo: least sample, us */
	__u32 closing;		/* word 2 hi: ESE closes this subflow */
	__u32 samples;
	__u32 kind;
	__u32 amax[NBUCKETS];	/* LIA-VM: the largest alpha (Q16) of each bucket */
	__u64 bucket;		/* LIA-VM: the current bucket's number (time / (delta / 8)) */
	__u32 alpha;		/* the last alpha used, Q16 */
	__u32 matches;		/* ESE: consecutive samples that matched the reference */
};

/* trace records */
#define REC_SAMPLE	1
#define REC_INCREASE	2
#define REC_LOSS	3
#define REC_ESE		4

#define F_SLOWSTART	1	/* increase: the ACK was (partly) slow start */
#define F_OFF		2	/* sample: an off-period (LIA-VM), srtt kept */
#define F_NOTLIMITED	4	/* increase: not cwnd-limited, window left alone */
#define F_FIRST		16	/* sample: the connection's first subflow (ESE never closes it) */

struct sib {
	__u32 id;
	__u32 cwnd;
	__u32 srtt8;
	__u32 rtt;
};

struct rec {
	__u64 ts_ns;
	__u64 conn;		/* the MPTCP socket's address (identity within a run) */
	__u32 type;
	__u32 kind;
	__u32 sub;		/* subflow_id */
	__u32 flags;
	__u32 acked;		/* increase: segments ACKed; ESE: the reference subflow */
	__u32 acked_ca;		/* increase: of them, in congestion avoidance */
	__u32 rtt;		/* sample: the sample, us; loss: the new ssthresh */
	__u32 srtt8;		/* sample: sRTT after it (x 8) */
	__u32 min_rtt;		/* sample: least sample */
	__u32 samples;		/* sample: how many so far */
	__u32 cwnd_before;	/* increase / loss */
	__u32 cwnd_after;
	__u64 frac_before;	/* Q30 */
	__u64 frac_after;
	__u32 alpha;		/* LIA, LIA-VM: the alpha used, Q16 */
	__u32 n;		/* siblings below */
	struct sib sib[MAX_SUB];	/* this connection's counted subflows, this one included */
};

struct ese_event {
	__u32 token;
	__u32 sub;
	__u32 saddr;		/* network order */
	__u32 daddr;
	__u16 sport;		/* host order */
	__u16 dport;
	__u32 rtt;
	__u32 ref_rtt;
	__u32 min_rtt;
};

extern __u32 tcp_slow_start(struct tcp_sock *tp, __u32 acked) __ksym;
extern __u32 tcp_reno_ssthresh(struct sock *sk) __ksym;
extern __u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

static __always_inline struct bwf_cc *ca_of(struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline __u64 conf(__u32 i, __u64 dflt)
{
	__u64 *v = bpf_map_lookup_elem(&bwf_ccconf, &i);

	return v && *v ? *v : dflt;
}

static __always_inline void stat(__u32 i, __u64 n)
{
	__u64 *p = bpf_map_lookup_elem(&bwf_ccstat, &i);

	if (p)
		__sync_fetch_and_add(p, n);
}

static __always_inline int tracing(void)
{
	__u32 i = CONF_TRACE;
	__u64 *v = bpf_map_lookup_elem(&bwf_ccconf, &i);

	return v && *v;
}

/* the subflow is its connection's first (msk->first) */
static __always_inline int is_first(struct sock *sk, struct mptcp_sock *msk)
{
	return msk && (__u64)msk->first == (__u64)sk;
}

/* the MPTCP socket of a subflow (0 if sk is not one) */
static __always_inline struct mptcp_sock *msk_of(struct sock *sk)
{
	struct mptcp_subflow_context *ctx;
	struct sock *conn;

	if (!BPF_CORE_READ_BITFIELD(((struct tcp_sock *)sk), is_mptcp))
		return 0;
	ctx = bpf_rdonly_cast(((struct inet_connection_sock *)sk)->icsk_ulp_data,
			      bpf_core_type_id_kernel(struct mptcp_subflow_context));
	if (!ctx)
		return 0;
	conn = ctx->conn;
	if (!conn)
		return 0;
	return bpf_rdonly_cast(conn, bpf_core_type_id_kernel(struct mptcp_sock));
}

static __always_inline __u32 subflow_id(struct sock *sk)
{
	struct mptcp_subflow_context *ctx;

	ctx = bpf_rdonly_cast(((struct inet_connection_sock *)sk)->icsk_ulp_data,
			      bpf_core_type_id_kernel(struct mptcp_subflow_context));
	return ctx ? ctx->subflow_id : 0;
}

/* The connection's counted subflows (see the header), this one included;
 * returns how many. */
static __always_inline __u32 siblings(struct sock *sk, struct sib *out)
{
	struct mptcp_sock *msk = msk_of(sk);
	struct list_head *head, *pos;
	struct mptcp_subflow_context *ctx;
	struct inet_connection_sock *icsk;
	struct tcp_sock *tp;
	const void *ops = ((struct inet_connection_sock *)sk)->icsk_ca_ops;
	__u64 w1, w2;
	__u32 n = 0, cwnd;
	int i;

	if (!msk)
		return 0;
	head = &msk->conn_list;
	pos = head->next;
	for (i = 0; i < MAX_SUB + 1; i++) {
		if (!pos || pos == head)
			break;
		ctx = bpf_rdonly_cast(pos, bpf_core_type_id_kernel(struct mptcp_subflow_context));
		pos = ctx->node.next;
		icsk = bpf_rdonly_cast(ctx->tcp_sock, bpf_core_type_id_kernel(struct inet_connection_sock));
		if (!icsk || (__u64)icsk->icsk_ca_ops != (__u64)ops ||
		    icsk->icsk_inet.sk.__sk_common.skc_state != TCP_ESTABLISHED)
			continue;
		tp = bpf_rdonly_cast(icsk, bpf_core_type_id_kernel(struct tcp_sock));
		cwnd = tp->snd_cwnd;
		w1 = icsk->icsk_ca_priv[1];
		w2 = icsk->icsk_ca_priv[2];
		if (cwnd == 0 || cwnd > MAX_W || (w2 >> 32)) {	/* not sane, or closing by ESE */
			if (!(w2 >> 32))
				stat(1, 1);
			continue;
		}
		if (n >= MAX_SUB)
			break;
		out[n].id = ctx->subflow_id;
		out[n].cwnd = cwnd;
		out[n].srtt8 = (__u32)w1;
		out[n].rtt = (__u32)(w1 >> 32);
		n++;
	}
	return n;
}

/* (T / S^2) in Q30, T and S in Q20 (see the header) */
static __always_inline __u64 ratio_q30(__u64 t, __u64 s)
{
	__u64 q;

	if (!s)
		return 0;
	q = (t << 24) / s;		/* t <= s: q <= 2^24 */
	return (q << 26) / s;
}

/* which sRTT (LIA) or latest sample (MPTCP-D) a sibling counts with */
static __always_inline __u32 rtt_of(struct sib *s, __u32 kind)
{
	return kind == KIND_MPTCPD ? s->rtt : s->srtt8;
}

/* The increase per ACKed segment in congestion avoidance (Q30), and LIA's
 * alpha (Q16) in *alpha. me: this subflow's index in sib. */
static __always_inline __u64 increase_q30(struct sib *sib, __u32 n, __u32 me, __u32 kind, __u32 *alpha)
{
	__u64 rmin = ~0ULL, rho, wr, s = 0, m = 0, t = 0, wtot = 0, r, inc;
	__u32 i;

	for (i = 0; i < MAX_SUB; i++) {
		if (i >= n)
			break;
		r = rtt_of(&sib[i], kind);
		if (r && r < rmin)
			rmin = r;
	}
	if (rmin == ~0ULL)
		return 0;
	for (i = 0; i < MAX_SUB; i++) {
		if (i >= n)
			break;
		r = rtt_of(&sib[i], kind);
		if (!r)
			continue;
		rho = (rmin << Q20) / r;
		wr = (__u64)sib[i].cwnd * rho;		/* Q20, <= 2^36 */
		s += wr;
		wtot += sib[i].cwnd;
		wr = (wr * rho) >> Q20;			/* w rho^2, Q20 */
		if (wr > m)
			m = wr;
		if (i == me)
			t = (wr * rho) >> Q20;		/* w rho^3, Q20 */
	}
	if (kind == KIND_MPTCPD)
		return ratio_q30(t, s);
	inc = ratio_q30(m, s);			/* alpha / w_total */
	*alpha = (__u32)((inc * wtot) >> 14);	/* Q16 */
	return inc;
}

static __always_inline void put_sample(struct bwf_cc *ca, __u32 rtt)
{
	ca->rtt = rtt;
	ca->samples++;
	if (!ca->min_rtt || rtt < ca->min_rtt)
		ca->min_rtt = rtt;
}

static __always_inline void ewma(struct bwf_cc *ca, __u32 rtt)
{
	if (!ca->srtt8)
		ca->srtt8 = rtt << 3;
	else
		ca->srtt8 = ca->srtt8 - (ca->srtt8 >> 3) + rtt;	/* 7/8 old + 1/8 new, x 8 */
}

/* amax[i] with i known only at run time: the verifier takes constant
 * offsets into a socket only, so each bucket is its own branch */
static __always_inline __u32 amax_get(struct bwf_cc *ca, __u32 idx)
{
	__u32 v = 0;
	int i;

#pragma unroll
	for (i = 0; i < NBUCKETS; i++)
		if (i == idx)
			v = ca->amax[i];
	return v;
}

static __always_inline void amax_set(struct bwf_cc *ca, __u32 idx, __u32 v)
{
	int i;

#pragma unroll
	for (i = 0; i < NBUCKETS; i++)
		if (i == idx)
			ca->amax[i] = v;
}

/* LIA-VM: move to the bucket of `now`, clearing the ones passed */
static __always_inline void roll(struct bwf_cc *ca, __u64 now_ns)
{
	__u64 width = conf(CONF_DELTA_MS, 1000) * 1000000ULL / NBUCKETS, b, k;
	int i;

	if (!width)
		width = 1;
	b = now_ns / width;
	if (b == ca->bucket)
		return;
	for (i = 1; i <= NBUCKETS; i++) {
		k = ca->bucket + i;
		if (k > b)
			break;
		amax_set(ca, k % NBUCKETS, 0);
	}
	ca->bucket = b;
}

static __always_inline __u32 recent_max(struct bwf_cc *ca)
{
	__u32 m = 0;
	int i;

#pragma unroll
	for (i = 0; i < NBUCKETS; i++)
		if (ca->amax[i] > m)
			m = ca->amax[i];
	return m;
}

static __always_inline void ese(struct sock *sk, struct bwf_cc *ca, __u32 rtt)
{
	struct mptcp_sock *msk;
	struct conn_key key = {};
	struct conn_state fresh = {}, *st;
	struct ese_event ev = {};
	struct ese_key ek = {};
	struct rec *r;
	__u64 a = conf(CONF_ESE_ALPHA, 1300), b = conf(CONF_ESE_BETA, 100);
	__u32 me, d, live, ref, i;
	struct sib sib[MAX_SUB];

	if (conf(CONF_ESE_OFF, 0) || ca->samples > conf(CONF_ESE_N, 80))
		return;
	if ((__u64)rtt * 1000 <= a * ca->min_rtt) {
		ca->matches = 0;
		return;
	}
	msk = msk_of(sk);
	if (!msk)
		return;
	key.msk = (__u64)msk;
	key.token = msk->token;
	st = bpf_map_lookup_elem(&bwf_ccconn, &key);
	if (!st) {
		bpf_map_update_elem(&bwf_ccconn, &key, &fresh, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&bwf_ccconn, &key);
		if (!st)
			return;
	}
	me = subflow_id(sk);
	if (!st->trig) {
		/* (the first subflow may be the reference; it is never closed, below) */
		st->trig = 1;
		st->ref_rtt = rtt;
		st->ref_sub = me;
		return;
	}
	if (me == st->ref_sub || is_first(sk, msk))
		return;
	live = siblings(sk, sib);
	if (live < 2) {
		ca->matches = 0;
		return;
	}
	ref = st->ref_rtt;
	if (!conf(CONF_ESE_FROZEN, 0)) {
		for (i = 0; i < MAX_SUB; i++)
			if (i < live && sib[i].id == st->ref_sub)
				ref = sib[i].rtt;
	}
	d = rtt > ref ? rtt - ref : ref - rtt;
	if ((__u64)d * 1000 >= b * ca->min_rtt) {
		ca->matches = 0;
		return;
	}
	if (++ca->matches < conf(CONF_ESE_CONFIRM, 4))
		return;
	ca->closing = 1;
	/* drain it: one segment in flight at most from now on (cc_cong_avoid
	 * keeps it there), so that the agent destroys it empty -- data lost
	 * with a destroyed subflow left a hole the receiver's full buffer could
	 * not take back (a connection stalled for minutes, 1 in 13 runs) */
	((struct tcp_sock *)sk)->snd_cwnd = 1;
	st->closed++;
	stat(2, 1);
	ev.token = key.token;
	ev.sub = me;
	ev.saddr = ek.saddr = sk->__sk_common.skc_rcv_saddr;
	ev.daddr = ek.daddr = sk->__sk_common.skc_daddr;
	ev.sport = ek.sport = sk->__sk_common.skc_num;
	ev.dport = ek.dport = bpf_ntohs(sk->__sk_common.skc_dport);
	ev.rtt = rtt;
	ev.ref_rtt = ref;
	ev.min_rtt = ca->min_rtt;
	bpf_map_update_elem(&bwf_ccese, &ek, &ev, BPF_ANY);
	if (tracing()) {
		r = bpf_ringbuf_reserve(&bwf_cctrace, sizeof(*r), 0);
		if (!r) {
			stat(4, 1);
			return;
		}
		__builtin_memset(r, 0, sizeof(*r));
		r->ts_ns = bpf_ktime_get_ns();
		r->conn = key.msk;
		r->type = REC_ESE;
		r->kind = ca->kind;
		r->sub = me;
		r->acked = st->ref_sub;
		r->rtt = rtt;
		r->min_rtt = ca->min_rtt;
		r->samples = ca->samples;
		bpf_ringbuf_submit(r, 0);
	}
}

static __always_inline void init_kind(struct sock *sk, __u32 kind)
{
	struct bwf_cc *ca = ca_of(sk);

	__builtin_memset(ca, 0, sizeof(*ca));
	ca->kind = kind;
}

SEC("struct_ops")
void BPF_PROG(lia_init, struct sock *sk)
{
	init_kind(sk, KIND_LIA);
}

SEC("struct_ops")
void BPF_PROG(mptcpd_init, struct sock *sk)
{
	init_kind(sk, KIND_MPTCPD);
}

SEC("struct_ops")
void BPF_PROG(liavm_init, struct sock *sk)
{
	init_kind(sk, KIND_LIAVM);
}

SEC("struct_ops")
void BPF_PROG(cc_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct bwf_cc *ca = ca_of(sk);
	__s32 us = sample->rtt_us;
	__u32 rtt, flags = 0;
	__u64 theta;
	struct rec *r;

	if (us <= 0)
		return;
	rtt = us;
	if (ca->kind == KIND_LIAVM && ca->min_rtt) {
		theta = conf(CONF_THETA, 10000);
		if ((__u64)rtt * 1000 > theta * ca->min_rtt)
			flags |= F_OFF;		/* Eq. 15: an off-period, not congestion */
	}
	put_sample(ca, rtt);
	if (flags & F_OFF)
		stat(3, 1);
	else
		ewma(ca, rtt);
	if (ca->kind == KIND_MPTCPD && !ca->closing)
		ese(sk, ca, rtt);
	if (!tracing())
		return;
	r = bpf_ringbuf_reserve(&bwf_cctrace, sizeof(*r), 0);
	if (!r) {
		stat(4, 1);
		return;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->ts_ns = bpf_ktime_get_ns();
	r->conn = (__u64)msk_of(sk);
	r->type = REC_SAMPLE;
	r->kind = ca->kind;
	r->sub = subflow_id(sk);
	r->flags = flags | (is_first(sk, msk_of(sk)) ? F_FIRST : 0);
	r->rtt = rtt;
	r->srtt8 = ca->srtt8;
	r->min_rtt = ca->min_rtt;
	r->samples = ca->samples;
	bpf_ringbuf_submit(r, 0);
}

static __always_inline int cwnd_limited(struct tcp_sock *tp)
{
	if (tp->snd_cwnd < tp->snd_ssthresh)
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return !!BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

SEC("struct_ops")
void BPF_PROG(cc_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct bwf_cc *ca = ca_of(sk);
	struct sib sib[MAX_SUB];
	__u32 n, i, me = MAX_SUB, alpha = 0, flags = 0, cwnd0 = tp->snd_cwnd, ca_acked = acked, id;
	__u64 inc = 0, frac0 = ca->frac, add, cwnd, now = 0, wtot = 0;
	struct rec *r;

	if (ca->closing) {		/* ESE: draining until the agent destroys it */
		tp->snd_cwnd = 1;
		return;
	}
	if (!cwnd_limited(tp)) {
		flags |= F_NOTLIMITED;
		ca_acked = 0;
	} else if (tp->snd_cwnd < tp->snd_ssthresh) {
		flags |= F_SLOWSTART;
		ca_acked = tcp_slow_start(tp, acked);
	}
	n = siblings(sk, sib);
	id = subflow_id(sk);
	for (i = 0; i < MAX_SUB; i++) {
		if (i >= n)
			break;
		if (sib[i].id == id)
			me = i;
		wtot += sib[i].cwnd;
	}
	if (ca_acked && me < MAX_SUB) {
		inc = increase_q30(sib, n, me, ca->kind, &alpha);
		if (ca->kind == KIND_LIAVM) {
			now = bpf_ktime_get_ns();
			roll(ca, now);
			if (ca->rtt && ca->min_rtt &&
			    (__u64)ca->rtt * 1000 > conf(CONF_THETA, 10000) * ca->min_rtt) {
				/* the last sample was an off-period: the largest recent alpha */
				alpha = recent_max(ca);
				if (!alpha || !wtot)
					alpha = (__u32)((inc * wtot) >> 14);
				inc = wtot ? ((__u64)alpha << 14) / wtot : 0;
				flags |= F_OFF;
			} else if (alpha > amax_get(ca, ca->bucket % NBUCKETS)) {
				amax_set(ca, ca->bucket % NBUCKETS, alpha);
			}
		}
		if (ca->kind != KIND_MPTCPD) {
			__u64 cap = (1ULL << Q30) / tp->snd_cwnd;	/* 1 / w_r */
			if (inc > cap)
				inc = cap;
		}
		add = ca->frac + inc * ca_acked;
		cwnd = tp->snd_cwnd + (add >> Q30);
		ca->frac = add & ((1ULL << Q30) - 1);
		tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
		ca->alpha = alpha;
		stat(0, 1);
	} else if (me == MAX_SUB && ca_acked) {
		/* not counted (no sample yet, or read failed): Reno's step */
		add = ca->frac + ((1ULL << Q30) / tp->snd_cwnd) * ca_acked;
		cwnd = tp->snd_cwnd + (add >> Q30);
		ca->frac = add & ((1ULL << Q30) - 1);
		tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
	}
	if (!tracing())
		return;
	r = bpf_ringbuf_reserve(&bwf_cctrace, sizeof(*r), 0);
	if (!r) {
		stat(4, 1);
		return;
	}
	r->ts_ns = now ? now : bpf_ktime_get_ns();
	r->conn = (__u64)msk_of(sk);
	r->type = REC_INCREASE;
	r->kind = ca->kind;
	r->sub = id;
	r->flags = flags | (me == MAX_SUB ? 8 : 0);
	r->acked = acked;
	r->acked_ca = ca_acked;
	r->rtt = ca->rtt;
	r->srtt8 = ca->srtt8;
	r->min_rtt = ca->min_rtt;
	r->samples = ca->samples;
	r->cwnd_before = cwnd0;
	r->cwnd_after = tp->snd_cwnd;
	r->frac_before = frac0;
	r->frac_after = ca->frac;
	r->alpha = alpha;
	r->n = n;
	for (i = 0; i < MAX_SUB; i++)
		r->sib[i] = i < n ? sib[i] : (struct sib){};
	bpf_ringbuf_submit(r, 0);
}

SEC("struct_ops")
__u32 BPF_PROG(cc_ssthresh, struct sock *sk)
{
	struct bwf_cc *ca = ca_of(sk);
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	__u32 th = tcp_reno_ssthresh(sk);
	struct rec *r;

	ca->frac = 0;
	if (!tracing())
		return th;
	r = bpf_ringbuf_reserve(&bwf_cctrace, sizeof(*r), 0);
	if (!r) {
		stat(4, 1);
		return th;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->ts_ns = bpf_ktime_get_ns();
	r->conn = (__u64)msk_of(sk);
	r->type = REC_LOSS;
	r->kind = ca->kind;
	r->sub = subflow_id(sk);
	r->cwnd_before = tp->snd_cwnd;
	r->rtt = th;
	bpf_ringbuf_submit(r, 0);
	return th;
}

SEC("struct_ops")
__u32 BPF_PROG(cc_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

#define BWF_COUPLED_OPS(var, init_fn)					\
	SEC(".struct_ops")						\
	struct tcp_congestion_ops var = {				\
		.init		= (void *)init_fn,			\
		.cong_avoid	= (void *)cc_cong_avoid,		\
		.ssthresh	= (void *)cc_ssthresh,			\
		.undo_cwnd	= (void *)cc_undo_cwnd,			\
		.pkts_acked	= (void *)cc_pkts_acked,		\
		.name		= #var,					\
	}

BWF_COUPLED_OPS(bwf_lia, lia_init);
BWF_COUPLED_OPS(bwf_mptcpd, mptcpd_init);
BWF_COUPLED_OPS(bwf_liavm, liavm_init);
