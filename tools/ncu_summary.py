#!/usr/bin/env python3
# Summarises an Nsight Compute raw CSV (tools/gpu-profile.sh) per kernel kind: launches, mean time,
# DRAM bytes read, DRAM throughput, active warps, registers. Usage: ncu_summary.py FILE.csv ...
import csv, collections, re, io, sys
for f in sys.argv[1:]:
    lines=open(f).read().splitlines()
    start=[i for i,l in enumerate(lines) if l.startswith('"ID"')][0]
    rows=list(csv.reader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"')))))
    hdr=rows[0]; units=rows[1]; data=rows[2:]
    ix={h:i for i,h in enumerate(hdr)}
    num=lambda s: float(s.replace(',','')) if s else 0.0
    agg=collections.OrderedDict()
    for r in data:
        name=r[ix['Kernel Name']]
        short=re.sub(r'\(.*','',name); short=re.sub(r'^void ','',short); short=short.replace('lilac::cuda::','').replace('(anonymous namespace)::','').replace('gemv_detail::','')
        grid=r[ix['launch__grid_size']]
        key=(short[:56],grid)
        a=agg.setdefault(key,[0,0,0,0,0,0])
        a[0]+=1;a[1]+=num(r[ix['gpu__time_duration.sum']]);a[2]+=num(r[ix['dram__bytes_read.sum']]);a[3]+=num(r[ix['dram__throughput.avg.pct_of_peak_sustained_elapsed']]); a[4]+=num(r[ix['sm__warps_active.avg.pct_of_peak_sustained_active']]); a[5]=r[ix['launch__registers_per_thread']]
    print(f, 'time', units[ix['gpu__time_duration.sum']], 'bytes', units[ix['dram__bytes_read.sum']], len(data), 'kernels')
    tot=0
    for (k,g),(n,t,b,p,w,reg) in agg.items():
        tot+=t
        print(f"{k:56s} grid {g:>6s} n {n:3d} avg {t/n:8.0f} read {b/n:10.3g} dram% {p/n:5.1f} warps% {w/n:5.1f} regs {reg}")
    print('total',tot)
