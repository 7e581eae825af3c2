/* SPDX-License-Identifier: GPL-2.0 */
/* The BG buckets bwf_mark keeps per VM and per VM-pair (pinned as
 * bwf_bgrate by the marker's load; bwf_sockops is loaded on that same map
 * and paces a pair's BG at its bucket's rate). One definition for both
 * programs: a map reused at load time must match it exactly. */
#ifndef BWF_BUCKETS_H
#define BWF_BUCKETS_H

struct bwf_key {
	__u32 src;		/* network order, as in the header */
	__u32 dst;		/* 0: the VM's hose */
};

struct bwf_rate {
	__u64 rate;		/* bytes per second */
	__u64 depth;		/* bytes */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct bwf_key);
	__type(value, struct bwf_rate);
} bwf_bgrate SEC(".maps");

#endif
