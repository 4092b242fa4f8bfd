import json,sys
for f in sys.argv[1:]:
    d=json.load(open(f)); ev=d['traceEvents'] if isinstance(d,dict) else d
    names={e.get('tid'):e.get('args',{}).get('name') for e in ev if e.get('ph')=='M'}
    X=[e for e in ev if e.get('ph')=='X']
    tn=lambda e: names.get(e.get('tid'))
    upd=sorted([e for e in X if tn(e)=='optimizer' and e['name'].startswith('update')], key=lambda e:e['ts'])
    ce=sorted([e for e in X if tn(e)=='compute' and e['name']=='cross_entropy_fwd'], key=lambda e:e['ts'])
    # group updates per step: the updates of a step start with 'update embedding' (unit 0)
    steps=[]; cur=[]
    for e in upd:
        if e['name']=='update embedding' and cur: steps.append(cur); cur=[]
        cur.append(e)
    if cur: steps.append(cur)
    out=[]
    for s in steps:
        go=s[0]['ts']; last=max(e['ts']+e['dur'] for e in s)
        nxt=[c for c in ce if c['ts']>go]
        if not nxt: continue
        fend=nxt[0]['ts']+nxt[0]['dur']
        cw=sum(e['dur'] for e in X if tn(e)=='compute' and e['name']=='wait' and go<=e['ts']<fend)
        cb=sum(e['dur'] for e in X if tn(e)=='compute' and e['name']!='wait' and go<=e['ts']<fend)
        out.append('go->last update %.0f ms, go->forward end %.0f ms, last update->forward end %.0f ms, compute busy %.0f ms'%((last-go)/1e3,(fend-go)/1e3,(fend-last)/1e3,cb/1e3))
    print(f); [print('  ',o) for o in out]
