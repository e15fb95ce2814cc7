-- purchase.lua: wrk sends each purchase as a buyer never seen before, the
-- rig of loadtest/README.md ("wrk and bench").
--
--   go run ./loadtest tokens --users 600000 --user-base 100000 --out /tmp/tokens.txt
--   wrk -t2 -c256 -d10s -s loadtest/wrk/purchase.lua URL/api/v1/vouchers/ID/orders \
--     -- /tmp/tokens.txt 100000 2
--
-- Arguments after --: the tokens file (one token a line, as loadtest tokens
-- writes them), the user id of its first line (--user-base), and wrk's -t.
-- Thread k of n sends lines k, k+n, k+2n, ... once each, in order, with
-- the bearer token and X-Loadtest-User (the ceiling server's buyer when it
-- checks no token), so every request is a new buyer until a thread's share
-- runs out; then it starts its share over (repeat presses: size the file
-- for the run).

local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  local path, base, threads = args[1], tonumber(args[2]), tonumber(args[3])
  tokens, users, n = {}, {}, 0
  local line_no = 0
  for line in io.lines(path) do
    if line_no % threads == id then
      tokens[#tokens + 1] = "Bearer " .. line
      users[#users + 1] = tostring(base + line_no)
    end
    line_no = line_no + 1
  end
  if #tokens == 0 then
    error("no tokens for thread " .. id .. " in " .. path)
  end
end

function request()
  n = n % #tokens + 1
  return wrk.format("POST", nil, {
    ["Host"] = wrk.headers["Host"],
    ["Authorization"] = tokens[n],
    ["X-Loadtest-User"] = users[n],
    ["Content-Length"] = "0",
  }, nil)
end
