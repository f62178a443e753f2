--[[
BenchFS as Slurm's burst buffer: the script Slurm's burst_buffer/lua plugin loads (Slurm 22.05,
Lua 5.1), installed beside slurm.conf as burst_buffer.lua. `benchfs-config --slurm-bb-lua`
prints where this copy is; docs/burst-buffer.md is the manual.

A job asks for BenchFS with `#BB_LUA` lines, one directive each, before its first command:

  #BB_LUA servers_per_node 2
  #BB_LUA mount /tmp/bfs
  #BB_LUA stage_in /home/me/input /input
  #BB_LUA stage_out /output /home/me/results
  #BB_LUA set client.read_ahead=64M
  #BB_LUA replicas 2
  #BB_LUA screen quick

The directives are read here, once: the three functions Slurm calls inside slurmctld with its
locks held (job_process, pools, paths) are plain Lua with no process started; the others run in
slurmscriptd's children, as SlurmUser on the controller's host, and hand the job's directives
to `benchfs bb PHASE` as options (quoted for the shell). The site's settings are in
benchfs_bb.conf beside this file (KEY = VALUE lines).
--]]

local SCRIPT_DIR = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local SITE_FILE = SCRIPT_DIR .. "/benchfs_bb.conf"

-- The configuration keys a job may set: layout.* and client.* of docs/config.md, each with the
-- kind of its value (tests/test_burst_buffer.py checks this against the configuration itself).
local SET_KEYS = {
	["layout.chunk_size"] = "size",
	["layout.inline_max"] = "size",
	["layout.replicas"] = "int",
	["client.max_inflight"] = "int",
	["client.max_inflight_per_server"] = "int",
	["client.request_timeout_s"] = "float",
	["client.max_retries"] = "int",
	["client.retry_backoff_ms"] = "int",
	["client.read_ahead"] = "size",
	["client.write_behind"] = "size",
	["client.mount_write_behind"] = "size",
	["client.link_roots"] = "string",
}

local KINDS = {
	int = { "^%d+$", "a whole number" },
	float = { "^%d+%.?%d*$", "a number" },
	size = { "^%d+[KMGTkmgt]?i?[Bb]?$", "a size such as 4M or 65536" },
	string = { "^[^%s]+$", "a value" },
}

local KEYWORDS = "servers_per_node, mount, stage_in, stage_out, set, replicas, screen"

-- Site settings: KEY = VALUE lines, `#` comments. Returns the table, or nil and one line.
local function read_site()
	local f, err = io.open(SITE_FILE, "r")
	if not f then
		return nil, "cannot read the site settings " .. SITE_FILE .. ": " .. tostring(err)
	end
	local site = { launcher = "local", max_servers_per_node = "16", shared_host = "no" }
	local n = 0
	for line in f:lines() do
		n = n + 1
		if not line:match("^%s*#") and line:match("%S") then
			local key, value = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
			if not key then
				f:close()
				return nil, SITE_FILE .. ":" .. n .. ": expected KEY = VALUE"
			end
			site[key] = value
		end
	end
	f:close()
	for _, key in ipairs({ "benchfs", "root" }) do
		if not site[key] or site[key] == "" then
			return nil, SITE_FILE .. ": " .. key .. " is not set"
		end
	end
	return site
end

local function quote(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function absolute(path)
	return path:sub(1, 1) == "/" and not path:find("%z")
end

-- The job's directives, from its script (the file Slurm wrote; it ends with a NUL). As Slurm
-- reads them: `#BB_LUA` lines among the leading `#` lines, a trailing `\` continuing one.
-- Returns a table, or nil and one line naming the directive and what is wrong.
local function parse(job_script, site)
	local f, err = io.open(job_script, "r")
	if not f then
		return nil, "cannot read the job script: " .. tostring(err)
	end
	local text = f:read("*a"):gsub("%z", "")
	f:close()
	local job = { sets = {}, stage_in = {}, stage_out = {}, seen = {} }
	local max_per_node = tonumber(site.max_servers_per_node) or 16
	local number = 0
	local pending = nil
	for line in (text .. "\n"):gmatch("([^\n]*)\n") do
		number = number + 1
		if pending then
			line = pending .. line
			pending = nil
		end
		if line ~= "" and line:sub(1, 1) ~= "#" then
			break
		end
		if line:sub(-1) == "\\" then
			pending = line:sub(1, -2)
		elseif line:sub(1, 7) == "#BB_LUA" then
			local where = "line " .. number .. ": "
			local words = {}
			for word in line:sub(8):gmatch("%S+") do
				words[#words + 1] = word
			end
			local keyword = words[1]
			local function once(what)
				if job.seen[what] then
					return where .. what .. " given twice (first on line " .. job.seen[what] .. ")"
				end
				job.seen[what] = number
			end
			local function args(count, usage)
				if #words - 1 ~= count then
					return where .. keyword .. " takes " .. usage
				end
			end
			local problem
			if keyword == nil or keyword == "benchfs" then
				problem = nil -- a bare #BB_LUA asks for BenchFS with every default
			elseif keyword:find("=") and (keyword:match("^capacity=") or keyword:match("^pool=")) then
				problem = where .. "capacity= and pool= are not used: BenchFS keeps its data on the job's own nodes"
			elseif keyword == "servers_per_node" then
				problem = args(1, "one number") or once(keyword)
				local n = tonumber(words[2])
				if not problem and (not words[2]:match("^%d+$") or n < 1 or n > max_per_node) then
					problem = where .. "servers_per_node takes a whole number from 1 to " .. max_per_node
						.. ", not '" .. words[2] .. "'"
				end
				job.servers_per_node = words[2]
			elseif keyword == "mount" then
				problem = args(1, "one absolute directory") or once(keyword)
				if not problem and (not absolute(words[2]) or words[2] == "/") then
					problem = where .. "mount takes an absolute directory other than /, not '" .. words[2] .. "'"
				end
				job.mount = words[2]
			elseif keyword == "stage_in" or keyword == "stage_out" then
				problem = args(2, "SOURCE DESTINATION (absolute paths without spaces)")
				if not problem then
					for i = 2, 3 do
						if not absolute(words[i]) then
							problem = where .. keyword .. ": '" .. words[i] .. "' is not an absolute path"
						end
					end
				end
				table.insert(job[keyword], { words[2], words[3] })
			elseif keyword == "set" or keyword == "replicas" then
				local setting = keyword == "set" and words[2] or ("layout.replicas=" .. tostring(words[2]))
				problem = args(1, keyword == "set" and "one KEY=VALUE" or "one number (1, 2 or 3)")
				local key, value = (setting or ""):match("^([%w_.]+)=(.+)$")
				if not problem and not key then
					problem = where .. "set takes KEY=VALUE, not '" .. setting .. "'"
				elseif not problem and not SET_KEYS[key] then
					problem = where .. "set: '" .. key .. "' is not a key a job may set (layout.* and client.* keys of docs/config.md)"
				elseif not problem then
					local kind = KINDS[SET_KEYS[key]]
					if not value:match(kind[1]) then
						problem = where .. key .. " takes " .. kind[2] .. ", not '" .. value .. "'"
					end
				end
				problem = problem or once(key or keyword)
				job.sets[#job.sets + 1] = setting
			elseif keyword == "screen" then
				problem = once(keyword)
				if not problem and (#words > 2 or (words[2] and words[2] ~= "quick")) then
					problem = where .. "screen takes nothing or 'quick'"
				end
				job.screen = words[2] or "full"
			else
				problem = where .. "unknown directive '" .. keyword .. "' (known: " .. KEYWORDS .. ")"
			end
			if problem then
				return nil, problem
			end
		end
	end
	return job
end

-- The directives as `benchfs bb` options, quoted for the shell.
local function options(job, site)
	local out = { "--root", quote(site.root), "--launcher", quote(site.launcher) }
	if site.nodes_file and site.nodes_file ~= "" then
		out[#out + 1] = "--nodes-file " .. quote(site.nodes_file)
	end
	if site.scratch and site.scratch ~= "" then
		out[#out + 1] = "--scratch " .. quote(site.scratch)
	end
	if site.shared_host == "yes" then
		out[#out + 1] = "--shared-host"
	end
	if job.servers_per_node then
		out[#out + 1] = "--servers-per-node " .. quote(job.servers_per_node)
	end
	if job.mount then
		out[#out + 1] = "--mount " .. quote(job.mount)
	end
	for _, pair in ipairs(job.stage_in) do
		out[#out + 1] = "--stage-in " .. quote(pair[1]) .. " " .. quote(pair[2])
	end
	for _, pair in ipairs(job.stage_out) do
		out[#out + 1] = "--stage-out " .. quote(pair[1]) .. " " .. quote(pair[2])
	end
	for _, setting in ipairs(job.sets) do
		out[#out + 1] = "--set " .. quote(setting)
	end
	if job.screen then
		out[#out + 1] = "--screen " .. quote(job.screen)
	end
	return table.concat(out, " ")
end

local EXIT_MARK = "BENCHFS_BB_EXIT="

-- Runs `benchfs bb PHASE JOB_ID OPTIONS...` (stdin and stdout given explicitly: slurmctld
-- may have none open); its last line is the message Slurm records (all of it, with `whole`).
local function run_phase(phase, job_id, job_script, extra, whole)
	local site, err = read_site()
	if not site then
		slurm.log_error("%s", "benchfs: " .. err)
		return slurm.ERROR, err
	end
	local job = { sets = {}, stage_in = {}, stage_out = {} }
	if job_script then
		local parsed, problem = parse(job_script, site)
		if not parsed then
			return slurm.ERROR, problem
		end
		job = parsed
	end
	local command = quote(site.benchfs) .. " bb " .. phase .. " " .. quote(job_id) .. " "
		.. options(job, site) .. " " .. (extra or "")
	local pipe = io.popen(command .. " </dev/null 2>&1; echo " .. EXIT_MARK .. "$?")
	local output = pipe:read("*a")
	pipe:close()
	local status = tonumber(output:match(EXIT_MARK .. "(%d+)")) or 255
	local last, lines = "", {}
	for line in output:gmatch("[^\n]+") do
		if not line:find(EXIT_MARK, 1, true) then
			last = line
			lines[#lines + 1] = line
		end
	end
	slurm.log_info("%s", "benchfs bb " .. phase .. " JobId=" .. job_id .. " exit " .. status .. ": " .. last)
	if whole then
		last = table.concat(lines, "\n") .. "\n"
	end
	if status ~= 0 then
		return slurm.ERROR, last
	end
	return slurm.SUCCESS, last
end

-- Synchronous, inside slurmctld: check the directives at submission.
function slurm_bb_job_process(job_script)
	local site, err = read_site()
	if not site then
		return slurm.ERROR, err
	end
	local job, problem = parse(job_script, site)
	if not job then
		return slurm.ERROR, problem
	end
	return slurm.SUCCESS
end

-- Synchronous: node-local storage is the job's own, not a pool jobs draw from; no pools.
function slurm_bb_pools()
	return slurm.SUCCESS
end

-- Synchronous, when the job starts and before pre_run: the job's environment. Must not fail
-- (the job would be held for good), so a problem only leaves a variable out.
function slurm_bb_paths(job_id, job_script, path_file)
	local site = read_site()
	if not site then
		return slurm.SUCCESS
	end
	local job = parse(job_script, site) or {}
	local dir = site.root .. "/" .. job_id
	local lines = {
		"BENCHFS_BB_DIR=" .. dir,
		"BENCHFS_JOB_DIR=" .. dir .. "/run",
		"BENCHFS_CONFIG=" .. dir .. "/run/config.toml",
		"BENCHFS_REGISTRY=" .. dir .. "/run/registry",
		"BENCHFS_EXCLUDED_FILE=" .. dir .. "/excluded.txt",
	}
	if job.mount then
		-- Nodes sharing one host's directories mount at MOUNT/NODE: the link leads to the
		-- batch node's (made by pre_run).
		lines[#lines + 1] = "BENCHFS_MOUNT=" .. (site.shared_host == "yes" and dir .. "/mount" or job.mount)
	end
	local f = io.open(path_file, "w")
	if f then
		f:write(table.concat(lines, "\n") .. "\n")
		f:close()
	end
	return slurm.SUCCESS
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	return run_phase("setup", job_id, job_script, "--uid " .. quote(uid) .. " --gid " .. quote(gid))
end

-- While the job is pending: no nodes yet, so only the sources are checked, as the job's user.
function slurm_bb_data_in(job_id, job_script)
	return run_phase("data-in", job_id, job_script)
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

-- Nodes allocated, the job's script not started: start BenchFS on them and stage in.
function slurm_bb_pre_run(job_id, job_script)
	return run_phase("pre-run", job_id, job_script)
end

-- The job ended (succeeded, failed, cancelled or its node died): record how.
function slurm_bb_post_run(job_id, job_script)
	return run_phase("post-run", job_id, job_script)
end

function slurm_bb_data_out(job_id, job_script)
	return run_phase("data-out", job_id, job_script)
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	local flag = hurry == "true" and "--hurry" or ""
	return run_phase("teardown", job_id, job_script, flag)
end

-- `scontrol show bbstat [JOBID]`: any user may ask, so only a job number is passed on.
function slurm_bb_get_status(...)
	local args = { ... }
	local job = args[1] and args[1]:match("^%d+$") or "all"
	return run_phase("status", job, nil, nil, true)
end
