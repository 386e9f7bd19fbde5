import re, sys
lines=[l for l in open(sys.argv[1]) if 'request cmpl' in l]
ev=[]
for l in lines:
    m=re.search(r'arrived ([\d.]+), admitted \+([\d.]+) ms, queued \+([\d.]+) ms, scheduled \+([\d.]+) ms, first token \+([\d.]+)',l)
    a=float(m.group(1)); ev.append((a,)+tuple(a+float(m.group(i))/1e3 for i in range(2,6)))
ev.sort()
bursts=[[ev[0]]]
for e in ev[1:]:
    if e[0]-bursts[-1][-1][0]>0.5: bursts.append([e])
    else: bursts[-1].append(e)
for b in bursts[:int(sys.argv[2])]:
    if len(b)!=16: continue
    t0=min(e[0] for e in b)
    firsts=sorted(round((e[4]-t0)*1e3) for e in b)
    qs=sorted(round((e[2]-t0)*1e3,1) for e in b)
    print('arrivals over %.1f ms'%((max(e[0] for e in b)-t0)*1e3), 'admitted<=%.1f'%((max(e[1] for e in b)-t0)*1e3), 'queued', qs[0], qs[-1], 'first tokens', firsts[0], firsts[-1], ' steps(by first-token groups):', len(set(round(f/5) for f in firsts)))
