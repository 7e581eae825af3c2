// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_sockops: per-subflow settings for MPTCP connections.
 *
 * The first subflow of an MPTCP connection is the bandwidth-guarantee (BG)
 * subflow: Reno, paced at most at its VM's guarantee (see pace_bg). Every
 * MP_JOIN subflow is work conservation (WC): bwf_wc, and a send buffer that
 * follows its window: 2 x cwnd x (MSS + 1 KiB), about what TCP's own
 * autotuning gives a window (the KiB is a packet's buffer overhead: send
 * buffers count memory, not payload), at least 2 x SNDBUF_MIN, set again at
 * every RTT sample. MPTCP's scheduler hands a subflow data while its send
 * buffer has room; with the namespace's large initial buffer (Eq. 1's B) it
 * parked 0.4-3 MB on a WC subflow draining at a few Mb/s, and the
 * connection's in-order delivery -- BG's data included -- then waited
 * seconds for WC. Sized to its window, WC holds about two of its round trips
 * of data; the rest waits at the connection level (tcp_wmem[0], see
 * hostagent.plan) for whichever subflow has room.
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
#define SNDBUF_MIN (32 * 1024)	/* the kernel doubles it: 64 KiB */

/* reused from bwf_wc's pinned maps at load time (bpftool ... map name) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} bwf_bgpace SEC(".maps");

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

/* no real window comes near this: bwf_wc repairs a corrupt one (see its
 * source) at the next ACK; until then the buffer keeps its size */
#define SANE_CWND (1U << 24)

/* WC's send buffer follows its window */
static __always_inline void size_wc_sndbuf(struct bpf_sock_ops *skops)
{
	__u64 want;
	int val;

	if (skops->snd_cwnd >= SANE_CWND)
		return;
	want = (__u64)skops->snd_cwnd * (skops->mss_cache + 1024);	/* x2 by the kernel */
	val = want > 0x3fffffff ? 0x3fffffff : (int)want;

	if (val < SNDBUF_MIN)
		val = SNDBUF_MIN;
	bpf_setsockopt(skops, SOL_SOCKET, SO_SNDBUF, &val, sizeof(val));
}

/* BG's pacing ceiling: its VM's guarantee, from bwf_bgpace (no entry: left
 * alone). WC subflows are not paced: a ceiling at the NIC rate (which turns
 * on the kernel's internal pacing) moved Table 3's WC shares from 0.105 to
 * 0.247 max relative error. The host's HTB holds BG there anyway; what pacing adds is that
 * BG's pacing rate -- which MPTCP's scheduler takes for the rate a subflow
 * drains at -- says so. Unpaced it was 2 x cwnd / srtt, 1.5-3x the
 * guarantee: the scheduler (lowest wmem / pacing rate first, nothing sent
 * when that subflow's buffer is full) kept picking a full BG subflow, and
 * the WC subflow had nothing to send 30-80 % of the time. */
static __always_inline void pace_bg(struct bpf_sock_ops *skops)
{
	__u32 key = skops->local_ip4;
	__u64 *rate = bpf_map_lookup_elem(&bwf_bgpace, &key);
	int val;

	if (!rate)
		return;
	val = *rate > 0x7fffffff ? 0x7fffffff : (int)*rate;
	bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &val, sizeof(val));
}

SEC("sockops")
int bwf_sockops(struct bpf_sock_ops *skops)
{
	char wc[] = "bwf_wc";
	char bg[] = "reno";
	int join;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		join = is_join(skops);
		if (join < 0)
			return 1;
		if (join)
			bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, wc, sizeof(wc));
		else
			bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, bg, sizeof(bg));
		/* MPTCP subflows only: no lookup per ACK for plain TCP */
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
		return 1;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		join = is_join(skops);
		if (join == 1)
			size_wc_sndbuf(skops);
		else if (join == 0)
			pace_bg(skops);
		return 1;
	case BPF_SOCK_OPS_RTT_CB:	/* enabled on MPTCP subflows only (above) */
		if (is_join(skops) == 1)
			size_wc_sndbuf(skops);
		else
			pace_bg(skops);
		return 1;
	}
	return 1;
}
