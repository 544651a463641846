# Sorts the failures of a pjdfstest run (`prove -rv tests > LOG` inside a Tessera mount) by
# what they test: files whose subject a file system without ownership, permissions, links and
# special files cannot pass, assertions of that kind inside the other files, and the rest
# (printed one per line). Usage: python3 pjdfstest-classify.py LOG
import re,sys,collections
log=sys.argv[1]
NA_FILES={
 'perm':'chmod/* chown/* */05.t */06.t open/06.t open/07.t open/08.t open/26.t rename/04.t rename/05.t rename/09.t rename/10.t rename/21.t rmdir/07.t rmdir/08.t rmdir/11.t unlink/11.t utimensat/05.t utimensat/06.t utimensat/07.t granular/*',
 'symlink':'symlink/* */07.t open/12.t open/16.t rename/11.t rmdir/05.t',
 'hardlink':'link/* rename/23.t',
 'special':'mkfifo/* mknod/* open/17.t open/24.t',
 'bsd':'chflags/*',
}
import fnmatch
def file_cat(f):
    for k,pats in NA_FILES.items():
        for p in pats.split():
            if fnmatch.fnmatch(f,p): return k
    return None
def line_cat(l):
    if re.search(r"tried '-[ugU] ",l): return 'perm'
    if re.search(r"'(l|f)?ch(own|mod) |fchmodat|fchownat",l) or re.search(r"(uid|gid|mode)[,']",l): return 'perm'
    if re.search(r"'(symlink|readlink|symlinkat) |symlink",l): return 'symlink'
    if re.search(r"'(link|linkat) |nlink",l): return 'hardlink'
    if re.search(r"'(mkfifo|mknod|mknodat|mkfifoat|bind|connect) |fifo|socket|block|char",l): return 'special'
    if re.search(r"atime|ctime",l): return 'times'
    return None
cur=None; tests=collections.Counter(); fails=collections.defaultdict(list); plans={}
for line in open(log,errors='replace'):
    m=re.match(r'^\S*/tests/(\S+\.t) \.\.',line)
    if m: cur=m.group(1); continue
    m=re.match(r'^1\.\.(\d+)',line)
    if m and cur: plans[cur]=int(m.group(1))
    if re.match(r'^(not )?ok \d+',line) and cur:
        tests[cur]+=1
        if line.startswith('not ok') and '# TODO' not in line: fails[cur].append(line.strip())
total=sum(tests.values()); 
cats=collections.Counter(); left=[]
na_tests=0
for f,n in tests.items():
    fc=file_cat(f)
    if fc: cats['file:'+fc]+=len(fails[f]); na_tests+=n; continue
    prev=None
    for l in fails[f]:
        c=line_cat(l)
        if c: cats['line:'+c]+=1; prev=c; continue
        left.append((f,l))
print('assertions run',total,'in files',len(tests),'failing',sum(len(v) for v in fails.values()))
print('assertions in n/a files',na_tests)
print(cats)
print('left',len(left))
for f,l in left: print(f,l[:170])
app=[f for f in tests if not file_cat(f)]
appfail=sum(len(fails[f]) for f in app)
print('applicable files',len(app),'assertions',sum(tests[f] for f in app),'failing',appfail,'passing',sum(tests[f] for f in app)-appfail)
print('applicable files all pass',sum(1 for f in app if not fails[f]))
