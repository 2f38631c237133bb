line 0 of web/lib/net.js
line 1 of web/lib/net.js
line 2 of web/lib/net.js
