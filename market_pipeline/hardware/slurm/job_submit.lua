--[[
market-pipeline: rule 4 of the rigid guarantee at submission (docs/hardware.md, the slurm backend).

While guaranteed work waits for capacity on a GPU model, the control loop's pass
(`SlurmAdapter.close_to_drainable`, each control tick) gives the pending drainable jobs asking
for that model a begin time one lease ahead. A drainable job submitted between two passes would
still start there at once. With this script as the cluster's job_submit plugin
(`JobSubmitPlugins=lua`, this file as `job_submit.lua` next to slurm.conf), such a job gets the
same begin time at submission.

The pass publishes the closure in `market-pipeline-closure` next to slurm.conf, one
`key value` per line:
  until <epoch seconds>   the lease end: past it the closure is void (a stopped loop's lapses)
  class <name>            the drainable partition (or QOS)
  type <gres type>        a GRES type of a closed GPU model, one line each
No file, a void lease or a job of another class or GRES type: the job is left as submitted.
The script never refuses a job.
]]

local CLOSURE_FILE = "market-pipeline-closure"

local function closure_path()
    local conf = os.getenv("SLURM_CONF") or "/etc/slurm/slurm.conf"
    local dir = string.match(conf, "^(.*)/[^/]*$") or "."
    return dir .. "/" .. CLOSURE_FILE
end

local function read_closure()
    local file = io.open(closure_path(), "r")
    if file == nil then
        return nil
    end
    local closure = { types = {} }
    for line in file:lines() do
        local key, value = string.match(line, "^(%S+)%s+(%S+)%s*$")
        if key == "until" then
            closure.lease_end = tonumber(value)
        elseif key == "class" then
            closure.class = value
        elseif key == "type" then
            closure.types[value] = true
        end
    end
    file:close()
    if closure.lease_end == nil or closure.class == nil or closure.lease_end <= os.time() then
        return nil
    end
    return closure
end

local function in_list(list, name)
    if list == nil then
        return false
    end
    for item in string.gmatch(list, "[^,]+") do
        if item == name then
            return true
        end
    end
    return false
end

-- the GRES types a job asks GPUs of: "gres:gpu:a100_80gb:1" (22.05), "gres/gpu:a100_80gb:1" (23.02 on)
local function closed_type(job_desc, types)
    for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }) do
        local spec = job_desc[field]
        if spec ~= nil then
            for gres_type in string.gmatch(spec, "gpu:([^:,]+):%d+") do
                if types[gres_type] then
                    return gres_type
                end
            end
        end
    end
    return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local closure = read_closure()
    if closure == nil then
        return slurm.SUCCESS
    end
    if not (in_list(job_desc.partition, closure.class) or in_list(job_desc.qos, closure.class)) then
        return slurm.SUCCESS
    end
    local gres_type = closed_type(job_desc, closure.types)
    if gres_type ~= nil and (job_desc.begin_time == nil or job_desc.begin_time < closure.lease_end) then
        job_desc.begin_time = closure.lease_end
        slurm.log_info("market-pipeline: drainable job on closed GPU type %s begins at %d", gres_type, closure.lease_end)
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
