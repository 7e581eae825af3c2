// SPDX-License-Identifier: GPL-2.0
/*
 * bwf_mark: a VM's BG limited at its host by demotion, not by a queue.
 *
 * A two-colour marker (a token bucket per VM, RFC 2697's single rate with
 * one bucket) on the egress of the VM's interface (tc clsact, before the
 * qdisc): a BG packet (DSCP CS0) that finds tokens for its bytes stays BG;
 * one that does not is
 *   - TCP and everything else but UDP: demoted to WC (DSCP CS1, ECN bits
 *     kept): it leaves at once, in the host's and every switch's low
 *     priority queue, and takes spare capacity if there is any;
 *   - UDP: dropped. The switches make every UDP packet BG and meter it at
 *     the guarantee (apps/prio_queues), so a demoted UDP packet would be
 *     promoted again at the ToR and spend the meter's tokens that the VM's
 *     conforming TCP needs.
 *
 * What it replaces: the host's HTB class for BG at rate = ceil = the
 * guarantee, whose FIFO (>= 256 KiB: veth makes 64 KiB GSO packets) held
 * seconds of the VM's BG at a small guarantee -- a VM's own UDP or long
 * flows kept its new connections' handshakes waiting 4 s and more
 * (benchmarks/bg_hol.py: 0 of 3 connections opened in 30 s). With the
 * marker, BG's class may borrow up to the NIC (what reaches it conforms),
 * so BG waits behind nothing but its burst, and a short flow beyond its
 * tokens is not held to the guarantee when the fabric has room.
 *
 * The bucket: bwf_bgrate (key: VM IPv4 source and destination -- 0 for
 * the VM's whole hose -- value: rate in bytes/s and depth in bytes, written
 * by the agent) and bwf_bgstate (tokens, last refill and the bytes that
 * conformed, were demoted and were dropped; kept here). Bytes are the
 * frame's (skb->len at the device: what the switch's meter counts). A
 * packet to a destination with a pair entry (source, destination: the
 * pipe model's or LRC's limit of that VM-pair) must conform to it and then
 * to the hose entry (source, 0); a packet with neither is left alone. Counting tokens in
 * byte-nanoseconds keeps the arithmetic exact, and within 64 bits for
 * any bucket the agent plans (rate <= 5e10 B/s, depth <= 2.5e9 B): a refill
 * that would overflow the depth fills the bucket instead of multiplying.
 */
 /*
 * Young flows first at the host. A packet that leaves as WC (demoted here,
 * or a WC join's) from a TCP socket that has had fewer than YOUNG_BYTES
 * acknowledged is steered to the host's "young" HTB class (skb->priority =
 * 1:YOUNG_MINOR, which HTB takes before its filters): its rate is WC's
 * whole share, the old WC class's only a floor, so a flow's first bytes
 * never wait behind its VM's long flows' WC backlog (one FIFO of >= 256 KiB,
 * 200 ms at 10 Mb/s) -- a least-attained-service approximation with two
 * levels, as PIAS does in switches. Everything else keeps its priority.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define ETH_P_IP 0x0800
#define IPPROTO_UDP 17
#define IPPROTO_TCP 6
/* what take() does with a packet the bucket has no tokens for */
#define OVER_DEMOTE 0
#define OVER_DROP 1
#define OVER_PASS 2	/* a TCP packet without payload: charged, never refused */
#define ETH_HLEN 14
#define IP_TOS_OFF (ETH_HLEN + 1)
#define IP_CSUM_OFF (ETH_HLEN + 10)
#define NSEC 1000000000ULL

#ifndef BG_PACE_AFTER
#define BG_PACE_AFTER (1 << 20)
#endif
#define YOUNG_BYTES BG_PACE_AFTER	/* a flow's first MiB: as long as its BG runs unpaced */
#ifndef YOUNG_CLASS
#define YOUNG_CLASS 0x10021		/* 1:21 (hostagent.plan.CLASS_YOUNG) */
#endif

#ifndef TOS_WC
#define TOS_WC 0x20
#endif
#ifndef TOS_MASK
#define TOS_MASK 0xfc
#endif

#include "bwf_buckets.h"

struct bwf_state {
	struct bpf_spin_lock lock;
	__u64 tokens_nb;	/* byte-nanoseconds */
	__u64 last_ns;
	__u64 conform;		/* bytes */
	__u64 demoted;
	__u64 dropped;
	__u64 rate;		/* the rate and depth the tokens were counted for: */
	__u64 depth;		/* a changed entry starts a full bucket */
	__u64 ce_marked;	/* bytes demoted and marked CE (see OVER_HEAVY) */
	__u64 over_ewma;	/* share of recent packets over the bucket, of 65536 */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct bwf_key);
	__type(value, struct bwf_state);
} bwf_bgstate SEC(".maps");

/*
 * Persistently over. A first subflow whose packets keep finding the bucket
 * empty -- a batch VM whose UDP holds all of its BG, say -- was demoted
 * whole and sent on as WC with its BG congestion control (Reno), beside
 * the joins' fair WC control and outside its weights: in the main job 2.0-2.5
 * Mb/s per batch VM of demoted first subflows took the spare the declared
 * policy gives the analytics VMs. When more than OVER_HEAVY of the bucket's
 * recent packets (an EWMA over about 8) were over it, a demoted data
 * packet that is ECN-capable, of an MPTCP connection that has a join
 * (its msk's extra_subflows), is also marked CE: its Reno backs off and
 * MPTCP's scheduler moves the connection's data to its joins. Pacing's 5 %
 * overshoot (bwf_sockops paces BG at 1.05 x the bucket) leaves isolated
 * over packets and no mark; single-path TCP and connections before their
 * join are demoted as before (they have nowhere else to go). Not by age:
 * a batch VM's first subflows, at 0.5 Mb/s each, took 16 s to reach 1 MiB.
 */
#define EWMA_ONE 65536
#define EWMA_SHIFT 3
#ifndef OVER_HEAVY
#define OVER_HEAVY (EWMA_ONE / 2)
#endif

/* 0: conforms, 1: does not, 2: does not and the bucket is persistently over */
/* ...and counts the packet's bytes as conformed, or as dropped or demoted (``over``) */
static __always_inline int take(struct bwf_key *key, struct bwf_rate *cfg, __u64 len, int over_action)
{
	struct bwf_state *st = bpf_map_lookup_elem(&bwf_bgstate, key), fresh = {};
	__u64 now = bpf_ktime_get_ns(), gap, depth_nb, cost;
	int over = 0;

	if (!st) {
		fresh.last_ns = now;
		fresh.rate = cfg->rate;
		fresh.depth = cfg->depth;
		fresh.tokens_nb = cfg->depth * NSEC;
		bpf_map_update_elem(&bwf_bgstate, key, &fresh, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&bwf_bgstate, key);
		if (!st)
			return 0;
	}
	/* the agent bounds rate <= 5e10 B/s and depth <= 2.5e9 B (hostagent.plan) */
	depth_nb = cfg->depth * NSEC;
	cost = len * NSEC;
	bpf_spin_lock(&st->lock);
	/* a changed rate (LRC moves a pair's every round) keeps the tokens
	 * there are, within the new depth: a full bucket at every change would
	 * let a burst through each time */
	st->rate = cfg->rate;
	st->depth = cfg->depth;
	gap = now > st->last_ns ? now - st->last_ns : 0;
	st->last_ns = now;
	if (st->tokens_nb > depth_nb)
		st->tokens_nb = depth_nb;
	/* gap x rate < depth_nb - tokens < 2^64, or the bucket is full */
	if (cfg->rate && gap >= (depth_nb - st->tokens_nb) / cfg->rate)
		st->tokens_nb = depth_nb;
	else
		st->tokens_nb += gap * cfg->rate;
	if (st->tokens_nb >= cost) {
		st->tokens_nb -= cost;
		st->conform += len;
	} else if (over_action == OVER_PASS) {
		st->tokens_nb = 0;
		st->conform += len;
	} else {
		over = 1;
		if (over_action == OVER_DROP)
			st->dropped += len;
		else
			st->demoted += len;
	}
	if (over_action != OVER_PASS) {
		st->over_ewma -= st->over_ewma >> EWMA_SHIFT;
		if (over)
			st->over_ewma += EWMA_ONE >> EWMA_SHIFT;
		if (over && st->over_ewma > OVER_HEAVY)
			over = 2;
	}
	bpf_spin_unlock(&st->lock);
	return over;
}

/* kernels before 6.18 (the 6.12 guests of coupled-vm-guest) called the
 * count of a connection's extra subflows pm.subflows */
struct mptcp_pm_data___subflows {
	__u8 subflows;
} __attribute__((preserve_access_index));

/* a subflow of an MPTCP connection that has a join to send on (see OVER_HEAVY) */
static __always_inline int joined_mptcp(struct __sk_buff *skb)
{
	struct bpf_sock *sk = skb->sk;
	struct mptcp_sock *msk;

	if (!sk)
		return 0;
	msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return 0;
	if (bpf_core_field_exists(msk->pm.extra_subflows))
		return msk->pm.extra_subflows > 0;
	return ((struct mptcp_pm_data___subflows *)&msk->pm)->subflows > 0;
}

static __always_inline void count_ce(struct bwf_key *key, __u64 len)
{
	struct bwf_state *st = bpf_map_lookup_elem(&bwf_bgstate, key);

	if (st)
		__sync_fetch_and_add(&st->ce_marked, len);
}

static __always_inline void steer_young(struct __sk_buff *skb)
{
	struct bpf_sock *sk = skb->sk;
	struct bpf_tcp_sock *tp;

	if (!sk)
		return;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return;
	tp = bpf_tcp_sock(sk);
	if (tp && tp->bytes_acked < YOUNG_BYTES)
		skb->priority = YOUNG_CLASS;
}

/* rewrite the IP header's ToS from ``from`` to ``to`` (``vihl``: the
 * version/IHL byte before it, for the checksum's 16-bit word); the packet's
 * pointers are invalid after this */
static __always_inline void set_tos(struct __sk_buff *skb, __u8 vihl, __u8 from, __u8 to)
{
	__u16 old = bpf_htons(((__u16)vihl << 8) | from), new = bpf_htons(((__u16)vihl << 8) | to);

	bpf_l3_csum_replace(skb, IP_CSUM_OFF, old, new, 2);
	bpf_skb_store_bytes(skb, IP_TOS_OFF, &to, 1, 0);
}

/*
 * A TCP packet that carries no data (a pure ACK, SYN, FIN or RST) is
 * charged to the bucket but never demoted: the ACKs a VM returns for the
 * BG it receives would otherwise be demoted whenever its own BG spends its
 * tokens, and a BG flow whose ACKs wait in the low-priority queues behind
 * the fabric's WC backlog falls far below its guarantee (measured in the
 * main job: 1-2 of 3 Mb/s). A full bucket is emptied by them at worst;
 * the ToR meter (guarantee x meter_headroom) still polices a host that
 * sends such packets on purpose.
 */
/*
 * ...and one that leaves a WC socket (a WC join's ACKs for the WC it
 * receives) is promoted to BG, charged the same way: ACKs first. A WC
 * subflow's ACKs otherwise wait in the reverse direction's WC queues,
 * behind the WC data flowing that way (seconds at the emulation's rates:
 * WC round trips of 1-7 s were traced in the main job), and the same holds
 * for any flow whose ACKs cross a port its sender's own incoming data
 * fills (issue #32 §3: a flow between two hosts of one ToR whose sender
 * received four flows had a 330 ms round trip against its competitors'
 * 180 ms and got 0.2-0.4 of its share). ACKs are ~0.5 % of the bytes they
 * acknowledge at jumbo frames; the high-priority class carries them at
 * once, as Trinity and the ACK-prioritising home gateways do.
 */
static __always_inline int pure_tcp(struct __sk_buff *skb, struct iphdr *ip)
{
	__u32 ihl = (__u32)ip->ihl * 4;
	__u8 off;

	if (ihl < 20 || bpf_skb_load_bytes(skb, ETH_HLEN + ihl + 12, &off, 1))
		return 0;
	return bpf_ntohs(ip->tot_len) == ihl + (__u32)(off >> 4) * 4;
}

SEC("tc")
int bwf_mark(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	struct bwf_key key;
	struct bwf_rate *cfg;
	__u8 tos, new_tos, vihl;
	int over_action, over, pure;

	if (skb->protocol != bpf_htons(ETH_P_IP) || (void *)(ip + 1) > end)
		return TC_ACT_OK;
	tos = ip->tos;
	vihl = *(__u8 *)ip;
	pure = ip->protocol == IPPROTO_TCP && pure_tcp(skb, ip);
	over_action = ip->protocol == IPPROTO_UDP ? OVER_DROP : OVER_DEMOTE;
	if (pure)
		over_action = OVER_PASS;
	key.src = ip->saddr;
	key.dst = ip->daddr;
	if (tos & TOS_MASK) {		/* WC (a join's) or other: not ours to limit */
		if ((tos & TOS_MASK) != TOS_WC)
			return TC_ACT_OK;
		if (!pure) {
			steer_young(skb);
			return TC_ACT_OK;
		}
		/* a WC socket's ACK: promoted to BG, then charged like any BG ACK */
		set_tos(skb, vihl, tos, tos & ~TOS_MASK);
		tos &= ~TOS_MASK;
	}
	cfg = bpf_map_lookup_elem(&bwf_bgrate, &key);
	/* a pair's BG conforms to its own bucket and then to the VM's hose
	 * (what the ToR meter polices): the pairs' buckets start full and their
	 * bursts together must not exceed the hose's. One spin lock at a time:
	 * a packet the hose refuses has spent its pair's tokens already */
	if (cfg) {
		over = take(&key, cfg, skb->len, over_action);
		if (over)
			goto over;
	}
	key.dst = 0;
	cfg = bpf_map_lookup_elem(&bwf_bgrate, &key);
	if (!cfg)
		return TC_ACT_OK;
	over = take(&key, cfg, skb->len, over_action);
	if (!over)
		return TC_ACT_OK;
over:
	if (over_action == OVER_DROP)
		return TC_ACT_SHOT;
	new_tos = (tos & ~TOS_MASK) | TOS_WC;
	if (over == 2 && (new_tos & 3) && joined_mptcp(skb)) {
		new_tos |= 3;		/* ECT(0) or ECT(1) -> CE */
		count_ce(&key, skb->len);
	}
	set_tos(skb, vihl, tos, new_tos);
	steer_young(skb);
	return TC_ACT_OK;
}
